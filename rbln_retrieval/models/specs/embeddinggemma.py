"""EmbeddingGemma: a bidirectional Gemma3 encoder whose sentence-transformers Dense layers project the mean-pooled
vector; vLLM runs it as Gemma3TextModel and applies the Dense layers in its embedding head. Pooling (with the
prompt), the Dense projection, then matryoshka truncation and normalization, as sentence-transformers runs it.

Imports: errors, models (files, spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import dense_output_width, read_json
from rbln_retrieval.models.spec import Checkpoint, FamilySpec

ARCHS = frozenset({"Gemma3TextModel"})
# The retrieval prompts of its model card and config_sentence_transformers.json; an instruction becomes the query's
# task.
EMBEDDINGGEMMA_QUERY_TEMPLATE = "task: {instruction} | query: "
EMBEDDINGGEMMA_QUERY_PROMPT = EMBEDDINGGEMMA_QUERY_TEMPLATE.format(instruction="search result")
EMBEDDINGGEMMA_DOCUMENT_PROMPT = "title: none | text: "
# The sizes google/embeddinggemma-300m was trained to be truncated to (its model card), for checkpoints that
# declare none in config.json's ``matryoshka_dimensions`` (the key vLLM reads).
EMBEDDINGGEMMA_MATRYOSHKA = (768, 512, 256, 128)


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    common = ckpt.common()
    if ckpt.arch not in ARCHS:
        raise ModelNotSupportedError(
            f"{ckpt.path} is not an EmbeddingGemma checkpoint (architecture {ckpt.arch or 'none'!r})."
        )
    if ckpt.config.get("use_bidirectional_attention") is not True:
        raise ModelNotSupportedError(
            f"{ckpt.path} is a causal Gemma3 model (use_bidirectional_attention is not true); rbln-retrieval runs "
            "Gemma3 only as EmbeddingGemma's bidirectional encoder."
        )
    pooling_dirs = [m.get("path", "") for m in ckpt.modules if m.get("type", "").endswith("Pooling")] or ["1_Pooling"]
    pooling_config = read_json(ckpt.path / pooling_dirs[0] / "config.json")
    if isinstance(pooling_config, dict) and pooling_config.get("include_prompt") is False:
        # vLLM pools every token of the prompt; leaving the prompt's tokens out is not expressible there.
        raise ModelNotSupportedError(
            f"{ckpt.path}'s pooling leaves the prompt out (include_prompt is false), which vLLM cannot do."
        )
    if isinstance(pooling_config, dict) and ckpt.pooling is None:
        raise ModelNotSupportedError(
            f"{ckpt.path}'s pooling module uses none of the modes rbln-retrieval runs (mean, CLS, last token)."
        )
    width = dense_output_width(ckpt.path, ckpt.modules, int(ckpt.config.get("hidden_size", 0)))
    declared = ckpt.config.get("matryoshka_dimensions")
    sizes = tuple(declared) if declared else tuple(d for d in EMBEDDINGGEMMA_MATRYOSHKA if d <= width)
    if not all(isinstance(d, int) and 1 <= d <= width for d in sizes):
        raise ModelNotSupportedError(
            f"{ckpt.path} declares matryoshka_dimensions {list(sizes)}, not all within 1..{width}."
        )
    overrides = {"matryoshka_dimensions": list(sizes)} if sizes else {"is_matryoshka": True}
    return {
        **common,
        "pooling": ckpt.pooling or "MEAN",  # sentence-transformers' default without a pooling module
        "normalize": ckpt.normalizes,
        "query_prompt": ckpt.query_prompt(SPEC.query_prompt),
        "document_prompt": ckpt.document_prompt(SPEC.document_prompt),
        "matryoshka": True,
        "matryoshka_dimensions": sizes,
        "hidden_size": width,
        "hf_overrides": {**common["hf_overrides"], **overrides},
    }


SPEC = FamilySpec(
    name="embeddinggemma",
    architectures=ARCHS,
    preset=_preset,
    query_prompt=EMBEDDINGGEMMA_QUERY_PROMPT,
    document_prompt=EMBEDDINGGEMMA_DOCUMENT_PROMPT,
    query_template=EMBEDDINGGEMMA_QUERY_TEMPLATE,
    matryoshka=True,
)
