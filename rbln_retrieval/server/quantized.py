"""POST QUANTIZED_EMBED_PATH: quantized embeddings on the wire, which vLLM's own /v1/embeddings cannot send (its
``embed_dtype`` offers float32, float16, bfloat16 and fp8 only).

The body is vLLM's embeddings request (texts as ``input``) plus ``precision`` and, for int8/uint8, ``ranges``
(2, dim). The route runs vLLM's own embeddings handler on it (asking for float32 in base64, exact), quantizes as
rbln_retrieval.results.quantize does and answers ``{"precision", "dtype", "data": [{"index", "embedding"}]}``, each
embedding the row's quantized bytes in base64: 1 byte a dimension for int8/uint8, 1 bit for binary/ubinary. A
model without embeddings (a reranker) answers 404 in one sentence, a body that is not a JSON object 400; the work
is cancelled when the client disconnects, as on vLLM's own routes.

Imports: engines (protocol), results (quantize); numpy; FastAPI and vLLM inside the function that adds the route.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH
from rbln_retrieval.results.quantize import check_precision, quantize_embeddings

# The status nginx logs for a request its client closed before the answer; no client reads it.
CLIENT_CLOSED_REQUEST = 499


def add_quantized_route(app: Any) -> None:
    """Add POST QUANTIZED_EMBED_PATH to vLLM's FastAPI ``app`` (before the API key guard wraps every route)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
    from vllm.entrypoints.serve.utils.api_utils import with_cancellation

    def error(message: str, status: int = 400, kind: str = "BadRequestError") -> JSONResponse:
        body = {"message": message, "type": kind, "param": None, "code": status}
        return JSONResponse({"error": body}, status_code=status)

    async def serve_floats(request: Any, raw_request: Request) -> Any:
        return await raw_request.app.state.serving_embedding(request, raw_request)

    # The body is read before this runs, as vLLM's decorator needs: it listens for the disconnect meanwhile.
    embed_floats: Callable[[Any, Request], Awaitable[Any]] = with_cancellation(serve_floats)  # type: ignore[no-untyped-call]

    async def quantized_embeddings(raw_request: Request) -> Any:
        serving = getattr(raw_request.app.state, "serving_embedding", None)
        if serving is None:
            return error(
                f"The served model has no embeddings (a reranker or classifier), so POST {QUANTIZED_EMBED_PATH} "
                "cannot answer; score with /score or /rerank.",
                404,
                "NotFoundError",
            )
        try:
            body = await raw_request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error(f"The body of POST {QUANTIZED_EMBED_PATH} must be a JSON object (vLLM's embeddings request).")
        precision, ranges = body.pop("precision", "float32"), body.pop("ranges", None)
        try:
            check_precision(precision, ranges)
            scale = None if ranges is None else np.asarray(ranges, dtype=np.float32)
            # float32 in little-endian base64: the exact vectors, decoded below without a JSON float round trip.
            exact = {"encoding_format": "base64", "embed_dtype": "float32", "endianness": "little"}
            request = EmbeddingCompletionRequest(**{**body, **exact})
        except ValueError as exc:  # pydantic's ValidationError is one
            return error(str(exc))
        response = await embed_floats(request, raw_request)
        if response is None:  # the client disconnected and the work was cancelled: nobody reads this
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if response.status_code != 200:
            return response
        rows = sorted(json.loads(response.body)["data"], key=lambda row: row["index"])
        floats = np.stack([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in rows])
        try:
            quantized = quantize_embeddings(floats, precision, ranges=scale)
        except ValueError as exc:  # ranges of another width than the vectors
            return error(str(exc))
        data = [{"index": i, "embedding": base64.b64encode(row.tobytes()).decode()} for i, row in enumerate(quantized)]
        return {"precision": precision, "dtype": quantized.dtype.name, "data": data}

    # FastAPI reads the annotation to inject the request; postponed annotations would leave it the string "Request".
    quantized_embeddings.__annotations__["raw_request"] = Request
    app.add_api_route(QUANTIZED_EMBED_PATH, quantized_embeddings, methods=["POST"], include_in_schema=True)
