"""The ATOM route (``RBLN-CA*`` NPUs): every bucket graph compiled ahead of time by ``rebel.compile_from_torch`` and
run by rebel's runtime, as optimum-rbln does on ATOM, where vllm-rbln 0.12 refuses torch.compile.

Dynamo only captures each bucket graph (an FX module whose weights are module state and whose inputs have the
bucket's static shapes); ``AotBackend`` hands that module to rebel with its ``input_info``, keeps one ``.rbln``
artifact per graph (loaded instead of compiled when present), and runs it on the first visible NPU. All graphs are
compiled in one ``CompileContext`` with weight sharing: one copy of the weights on the NPU for every bucket.

May import: the standard library, torch; rebel only inside methods. Only ``rbln_runtime`` imports this module.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def input_info(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[tuple[str, list[int], str]]:
    """rebel's static input description: (name, shape, dtype) per graph input, named as the module's ``forward``
    names its arguments."""
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    if len(names) != len(example_inputs) or not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise TypeError(f"An ahead-of-time bucket graph takes tensors only, one per input {names}.")
    return [(name, list(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in zip(names, example_inputs)]


def artifact_name(gm: torch.fx.GraphModule, info: list[tuple[str, list[int], str]], snapshot: str = "") -> str:
    """The artifact's file name: the graph's code, its inputs and the content of the model files its weights come
    from, so a changed bucket, architecture or weights (a model saved over in place) never loads a stale one."""
    digest = hashlib.sha256(f"{gm.code}\n{info}\n{snapshot}".encode()).hexdigest()[:16]
    return f"graph-{digest}.rbln"


class AotBackend:
    """A torch.compile backend that compiles (or loads) each captured graph with rebel and runs it with rebel's
    runtime; on a compile-only host the captured graph runs on the CPU, so warmup completes (its outputs claim
    nothing about the NPU)."""

    def __init__(self, artifacts: Path, *, npu: str, compile_only: bool, snapshot: str = "") -> None:
        from rebel.compile_context import CompileContext

        self.artifacts = artifacts
        self.npu = npu
        self.snapshot = snapshot
        self.compile_only = compile_only
        self.context = CompileContext(use_weight_sharing=True)
        self.loaded = 0
        self.compiled = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **_: Any) -> Callable[..., Any]:
        import rebel

        info = input_info(gm, example_inputs)
        path = self.artifacts / artifact_name(gm, info, self.snapshot)
        if path.is_file():
            model = rebel.RBLNCompiledModel(str(path))
            self.loaded += 1
        else:
            model = rebel.compile_from_torch(
                gm,
                input_info=info,
                npu=self.npu,
                num_devices=1,
                example_inputs=list(example_inputs),
                compile_context=self.context,
            )
            self.artifacts.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            model.save(str(tmp))
            tmp.replace(path)
            self.compiled += 1
        logger.info("Bucket graph %s for %s: %s", path.name, self.npu, info)
        if self.compile_only:
            return gm.forward
        # Device 0 of the NPUs RBLN_VISIBLE_DEVICES leaves this process (rebel's runtime applies the variable).
        runtime = model.create_runtime(device=0, tensor_type="pt")

        def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = runtime(*(a.contiguous() for a in args))
            return (out,) if isinstance(out, torch.Tensor) else tuple(out)

        return run
