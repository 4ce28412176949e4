"""The systems under test, behind one small interface: embed documents, embed one query, score pairs.

- rbln-retrieval: ``PoolingEngine`` with the bundled runner (its default), with ``runner="stock"`` (vLLM's own
  CPU runner), and with upstream vllm-rbln's prefill (one request per step, padded) reproduced by explicit
  settings (bench/upstream_prefill.py);
- sentence-transformers: ``SentenceTransformer`` / ``CrossEncoder`` in float32 and in bfloat16 (its fastest
  setting on a CPU with AVX512_BF16), ``encode(batch_size=32)``, which already sorts by length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import upstream_prefill


@dataclass
class Spec:
    """One system: a name for the tables and how to build it."""

    name: str
    kind: str  # "rbln" or "st"
    dtype: str  # "bfloat16" or "float32"
    options: dict[str, Any] = field(default_factory=dict)
    upstream_prefill: bool = False  # one request per step padded to max_length (bench/upstream_prefill.py)

    def build(self, path: Path, cross_encoder: bool) -> System:
        if self.kind == "rbln":
            return RBLNSystem(self, path)
        return STSystem(self, path, cross_encoder)


class System:
    spec: Spec

    def embed(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def embed_query(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def score(self, query: str, documents: list[str]) -> list[float]:
        raise NotImplementedError

    def counters(self) -> dict[str, int] | None:
        """Steps and useful/computed tokens so far, where the system counts them."""
        return None

    def forget_prefixes(self) -> None:
        """Drop cached prompt prefixes, so a repeated ingest computes what an ingest of new passages would."""

    def close(self) -> None:
        pass


class RBLNSystem(System):
    def __init__(self, spec: Spec, path: Path):
        from rbln_retrieval import PoolingEngine

        self.spec = spec
        options = dict(spec.options)
        if spec.upstream_prefill:
            options["engine_kwargs"] = upstream_prefill.engine_kwargs(path, max_length=options.get("max_length"))
        self.engine = PoolingEngine(path, device="cpu", dtype=spec.dtype, **options)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.engine.embed(texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self.engine.embed([text], kind="query")[0]

    async def aembed_query(self, text: str) -> np.ndarray:
        return (await self.engine.aembed([text], kind="query"))[0]

    def score(self, query: str, documents: list[str]) -> list[float]:
        return self.engine.score(query, documents)

    def forget_prefixes(self) -> None:
        # vLLM's stock runner caches prefixes of causal models; the bundled runner turns prefix caching off.
        self.engine._loop.run(self.engine._vllm.reset_prefix_cache())

    def counters(self) -> dict[str, int] | None:
        stats = self.engine.stats()
        if "steps" not in stats:
            return None
        return {k: stats[k] for k in ("steps", "useful_tokens", "computed_tokens")}

    def close(self) -> None:
        self.engine.close()


class STSystem(System):
    BATCH = 32

    def __init__(self, spec: Spec, path: Path, cross_encoder: bool):
        import torch
        from sentence_transformers import CrossEncoder, SentenceTransformer

        self.spec = spec
        kwargs = {"torch_dtype": getattr(torch, spec.dtype)}
        if cross_encoder:
            self.model = CrossEncoder(str(path), device="cpu", max_length=512, model_kwargs=kwargs)
        else:
            self.model = SentenceTransformer(str(path), device="cpu", model_kwargs=kwargs)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = self.model.encode(texts, batch_size=self.BATCH, normalize_embeddings=True, convert_to_tensor=True)
        return out.float().numpy()

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def score(self, query: str, documents: list[str]) -> list[float]:
        scores = self.model.predict([(query, d) for d in documents], batch_size=self.BATCH, convert_to_tensor=True)
        return scores.float().tolist()


def specs(dtype_best: str) -> dict[str, Spec]:
    """Every system, keyed by its table name; ``dtype_best`` is this CPU's fast dtype (bfloat16 or float32)."""
    tag = "bf16" if dtype_best == "bfloat16" else "fp32"
    return {
        s.name: s
        for s in (
            Spec(f"rbln-retrieval bundled {tag}", "rbln", dtype_best),
            Spec("rbln-retrieval bundled fp32", "rbln", "float32"),
            Spec(f"rbln-retrieval stock runner {tag}", "rbln", dtype_best, {"runner": "stock"}),
            Spec(f"one request/step padded {tag}", "rbln", dtype_best, upstream_prefill=True),
            Spec("sentence-transformers fp32", "st", "float32"),
            Spec(f"sentence-transformers {tag}", "st", dtype_best),
        )
    }
