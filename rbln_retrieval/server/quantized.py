"""POST QUANTIZED_EMBED_PATH: quantized embeddings on the wire, which vLLM's own /v1/embeddings cannot send (its
``embed_dtype`` offers float32, float16, bfloat16 and fp8 only).

The body is vLLM's embeddings request (texts as ``input``) plus ``precision`` and, for int8/uint8, ``ranges``
(2, dim). The route runs vLLM's own embeddings handler on it (asking for float32 in base64, exact), quantizes as
rbln_retrieval.results.quantize does and answers ``{"precision", "dtype", "data": [{"index", "embedding"}]}``, each
embedding the row's quantized bytes in base64: 1 byte a dimension for int8/uint8, 1 bit for binary/ubinary.

Imports: engines (protocol), results (quantize); numpy; FastAPI and vLLM inside the function that adds the route.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH
from rbln_retrieval.results.quantize import check_precision, quantize_embeddings


def add_quantized_route(app: Any) -> None:
    """Add POST QUANTIZED_EMBED_PATH to vLLM's FastAPI ``app`` (before the API key guard wraps every route)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    def bad_request(message: str) -> JSONResponse:
        error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
        return JSONResponse({"error": error}, status_code=400)

    async def quantized_embeddings(raw_request: Request) -> Any:
        body = await raw_request.json()
        precision, ranges = body.pop("precision", "float32"), body.pop("ranges", None)
        try:
            check_precision(precision, ranges)
            scale = None if ranges is None else np.asarray(ranges, dtype=np.float32)
            # float32 in little-endian base64: the exact vectors, decoded below without a JSON float round trip.
            exact = {"encoding_format": "base64", "embed_dtype": "float32", "endianness": "little"}
            request = EmbeddingCompletionRequest(**{**body, **exact})
        except ValueError as exc:  # pydantic's ValidationError is one
            return bad_request(str(exc))
        response = await raw_request.app.state.serving_embedding(request, raw_request)
        if response.status_code != 200:
            return response
        rows = sorted(json.loads(response.body)["data"], key=lambda row: row["index"])
        floats = np.stack([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in rows])
        try:
            quantized = quantize_embeddings(floats, precision, ranges=scale)
        except ValueError as exc:  # ranges of another width than the vectors
            return bad_request(str(exc))
        data = [{"index": i, "embedding": base64.b64encode(row.tobytes()).decode()} for i, row in enumerate(quantized)]
        return {"precision": precision, "dtype": quantized.dtype.name, "data": data}

    # FastAPI reads the annotation to inject the request; postponed annotations would leave it the string "Request".
    quantized_embeddings.__annotations__["raw_request"] = Request
    app.add_api_route(QUANTIZED_EMBED_PATH, quantized_embeddings, methods=["POST"], include_in_schema=True)
