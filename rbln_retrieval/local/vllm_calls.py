"""Where PoolingEngine meets vLLM's engine API: starting an engine for a model, and encoding token prompts on it.

Both turn vLLM's failures into one sentence naming the model: a start that fails deep inside vLLM, and an engine
that dies while serving a call.

Imports: backend, engines (options), errors, local (engine_args, inproc), models, quiet, results (outputs), text
(tokens); vLLM when an engine starts.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import uuid
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.errors import EngineDeadError, EngineStartError
from rbln_retrieval.local.engine_args import vllm_engine_kwargs
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.files import unreadable_weights
from rbln_retrieval.models.source import ModelSource
from rbln_retrieval.quiet import quiet_vllm
from rbln_retrieval.results.outputs import npu_note
from rbln_retrieval.text.tokens import Tokens

logger = logging.getLogger(__name__)


async def start_vllm(
    model: str, family: ModelFamily, options: EngineOptions, device: str, target: str | None, source: ModelSource
) -> Any:
    """vLLM's engine for ``model``: an InprocEngine in this process or an AsyncLLM with its engine processes."""
    quiet_vllm()
    from rbln_retrieval import backend

    # vLLM's processes started inside `activated` inherit the target; a stock engine's get the plugin off.
    # An in-process engine uses this process's vLLM platform: the bundled one, if vLLM's CPU platform is active.
    # Claiming first also resolves the platform under this package's plugin scope when nothing in the process has
    # imported vLLM yet, which a bare `import vllm` would do under every installed plugin (vllm-rbln's included).
    claimed = backend.claim_platform()
    in_process = options.in_process
    if in_process and not claimed and target is not None:
        logger.warning(
            "vLLM runs on another vendor's platform in this process; the bundled runner for %s runs in "
            "vLLM's engine processes instead (in_process=False).",
            model,
        )
        in_process = False
    if not in_process and multiprocessing.current_process().daemon:
        # vLLM would fail deep inside with "daemonic processes are not allowed to have children".
        raise EngineStartError(
            f"vLLM could not start an engine for {model}: in_process=False runs it in child processes, "
            "which a daemonic process (a multiprocessing Pool worker) cannot start; use in_process=True there."
        )
    from vllm import AsyncEngineArgs, envs

    from rbln_retrieval.local.inproc import InprocEngine

    kwargs = vllm_engine_kwargs(model, family, options, device=device, in_process=in_process, model_key=str(source))
    if family.spec.bundled_model:
        backend.import_model(family.spec.bundled_model)
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if in_process else {}
    engine: Any
    try:
        with backend.activated(target, env):
            # An in-process engine freezes vLLM's variables for the whole process; this start reads them anew.
            envs.disable_envs_cache()
            if in_process:
                engine = await InprocEngine.start(AsyncEngineArgs(**kwargs))
            else:
                from vllm.v1.engine.async_llm import AsyncLLM  # its import costs seconds; in-process engines skip it

                engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    except Exception as exc:  # vLLM raises many types from deep inside; callers get one sentence.
        # A weights file that fails in vLLM's worker process only says "see root cause above" here.
        reason = unreadable_weights(model) or (
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        raise EngineStartError(f"vLLM could not start an engine for {model}: {reason}") from exc
    finally:
        backend.drop_import_error_tracebacks()  # vLLM's first import happened somewhere in this start
    if target == "rbln" and (note := npu_note(family.name, model)):
        logger.warning(note)
    return engine


async def encode(
    engine: Any, model: str, tokens: list[Any], params: Any, bar: tqdm | None, *, stack: bool = True
) -> Any:
    """Submit every prompt at once (the scheduler batches them) and return outputs in input order, one row
    each, as one array (a chunk of rows costs one allocation, not one tensor per row), or as a list of
    arrays with ``stack=False`` (token-level outputs differ in length). An item that is not ``Tokens`` is a
    prompt vLLM takes as it is (an image's, local/image_calls.py)."""
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

    batch = uuid.uuid4().hex

    async def one(index: int, item: Any) -> np.ndarray:
        request_params = params
        prompt = TokensPrompt(prompt_token_ids=item.ids) if isinstance(item, Tokens) else item
        if isinstance(item, Tokens) and item.type_ids is not None:
            from vllm.entrypoints.pooling.scoring.utils import compress_token_type_ids

            request_params = params.clone()
            request_params.extra_kwargs = {"compressed_token_type_ids": compress_token_type_ids(item.type_ids)}
        final: Any = None
        async for output in engine.encode(prompt, request_params, f"{batch}-{index}"):
            final = output
        if bar is not None:
            bar.update(1)
        row: np.ndarray = final.outputs.data.float().numpy()
        return row

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, t)) for i, t in enumerate(tokens)]
    except* VLLMEngineDeadError as failure:
        raise EngineDeadError(
            f"The vLLM engine for {model} died while serving this call; the next call starts a new one."
        ) from failure.exceptions[0]
    rows = [task.result() for task in tasks]
    return np.stack(rows) if stack else rows
