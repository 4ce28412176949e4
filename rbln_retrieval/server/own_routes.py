"""This package's own routes: the model's description (GET DESCRIBE_PATH, which RemoteEngine reads), quantized
vectors (POST QUANTIZED_EMBED_PATH) and every output the engine gives locally (POST OUTPUTS_PATH).

QUANTIZED_EMBED_PATH takes /v1/embeddings' text request plus ``precision`` and, for int8/uint8, ``ranges`` (2, dim),
and answers ``{"precision", "dtype", "data": [{"index", "embedding"}]}``, each embedding the row's quantized bytes in
base64 (1 byte a dimension for int8/uint8, 1 bit for binary/ubinary), quantized by the engine as
rbln_retrieval.results.quantize does. OUTPUTS_PATH takes ``input`` (texts) or ``images`` (data URLs, through
media.py) and ``output`` (dense, sparse, multi_vector, or a list of them, as the family gives them: all three
from one forward, token vectors of texts or of page images, or sparse vectors only), ``kind`` (the model's query or
document prompt; none: the texts as given), ``normalize`` and ``truncate``; each row answers its outputs: dense as
base64 float32, sparse as ``{"indices", "values"}``, multi_vector as ``{"shape", "data"}`` (base64 float32, row-major).

Imports: engines (protocol, requests), results (quantize), server (check, engine_calls, openai_routes, responses,
routes); numpy; pydantic.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from rbln_retrieval.engines.protocol import DESCRIBE_PATH, OUTPUTS_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.engines.requests import Kind
from rbln_retrieval.results.quantize import Precision
from rbln_retrieval.server import responses as answers
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.engine_calls import base64_float32, embed_texts
from rbln_retrieval.server.openai_routes import EmbeddingsRequest, vllm_truncation
from rbln_retrieval.server.routes import Context, Route
from rbln_retrieval.text.inputs import Truncate

Output = Literal["dense", "sparse", "multi_vector"]


class QuantizedRequest(EmbeddingsRequest):
    model_config = ConfigDict(extra="forbid")
    precision: Precision = "float32"
    ranges: list[list[float]] | None = None


class OutputsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: list[str] | None = None
    images: list[str] | None = None
    output: Output | list[Output] = "dense"
    kind: Kind | None = None
    normalize: bool = True
    truncate: Literal["end", "start", "error"] = "end"


async def describe(context: Context, _: None) -> dict[str, Any]:
    """The served model's description; a server of several lists theirs under ``models`` (RemoteEngine takes its
    model's from there)."""
    if len(context.models) == 1:
        return context.models.pick(None, "any").description
    return {"models": [served.description for served in context.models.values()]}


async def quantized(context: Context, request: QuantizedRequest) -> dict[str, Any]:
    served = context.models.pick(request.model, "embed")
    if request.input is None or isinstance(request.input, str) or not all(isinstance(t, str) for t in request.input):
        raise Refused(f"POST {QUANTIZED_EMBED_PATH} takes `input` as a list of texts.")
    truncate = vllm_truncation(served, request.truncate_prompt_tokens, request.truncation_side)
    normalize = next((v for v in (request.use_activation, request.normalize) if v is not None), True)
    ranges = None if request.ranges is None else np.asarray(request.ranges, dtype=np.float32)
    options: dict[str, Any] = {"normalize": normalize, "truncate": truncate, "precision": request.precision}
    if request.dimensions is not None:
        options["dimensions"] = request.dimensions
    if ranges is not None:
        options["ranges"] = ranges
    texts: list[str] = list(request.input)  # type: ignore[arg-type]
    rows = np.asarray(await served.engine.aembed(texts, instruction="", **options))
    data = [{"index": i, "embedding": base64.b64encode(row.tobytes()).decode()} for i, row in enumerate(rows)]
    return {"precision": request.precision, "dtype": rows.dtype.name, "data": data}


async def outputs(context: Context, request: OutputsRequest) -> dict[str, Any]:
    served = context.models.pick(request.model, "embed")
    if (request.input is None) == (request.images is None):
        raise Refused("Send either `input` (texts) or `images` (data URLs).")
    names: list[Output] = [request.output] if isinstance(request.output, str) else list(request.output)
    output: Any = request.output if isinstance(request.output, str) else names
    if request.images is not None:
        items = [(f"images[{i}]", url) for i, url in enumerate(request.images)]
        images = await asyncio.to_thread(context.media.images, items, family=served.family, model=served.name)
        result = await served.engine.aembed_images(  # type: ignore[attr-defined]
            images, output=output, normalize=request.normalize
        )
    else:
        truncate: Truncate = request.truncate
        result = await embed_texts(
            served,
            request.input or [],
            kind=request.kind,
            normalize=request.normalize,
            truncate=truncate,
            output=output,
        )
    by_output = {names[0]: result} if isinstance(request.output, str) else result
    count = len(by_output[names[0]])
    data = [{"index": i, **{name: _wire(name, by_output[name][i]) for name in names}} for i in range(count)]
    return {"model": served.name, "data": data}


def _wire(output: str, value: Any) -> Any:
    if output == "sparse":
        indices = sorted(value)
        return {"indices": [int(i) for i in indices], "values": [float(value[i]) for i in indices]}
    if output == "multi_vector":
        matrix = np.asarray(value, dtype=np.float32)
        return {"shape": list(matrix.shape), "data": base64_float32(matrix.reshape(-1))}
    return base64_float32(value)


ROUTES = (
    Route(
        DESCRIBE_PATH,
        "GET",
        "openai",
        None,
        describe,
        "the model's family, prompts, limits and weights",
        answers.Description | answers.Descriptions,
    ),
    Route(
        QUANTIZED_EMBED_PATH, "POST", "openai", QuantizedRequest, quantized, "aembed(precision=...)", answers.Quantized
    ),
    Route(
        OUTPUTS_PATH,
        "POST",
        "openai",
        OutputsRequest,
        outputs,
        "aembed(output=...), aembed_images(output=...)",
        answers.Outputs,
    ),
)
