"""ColPali (``ColPaliForRetrieval``): a page image becomes token vectors (multi-vectors), a text query too, and a
query scores a page by MaxSim summed over the query's vectors (transformers' ``ColPaliProcessor.score_retrieval``).

The prompts are ColPaliProcessor's, read from the checkpoint's processor_config.json: a page is
``<image> x image_seq_length + <bos> + visual_prompt_prefix + "\\n"`` (vLLM's PaliGemma processor puts the image
tokens and <bos> before the prompt given here); a query is ``<bos> + query_prefix + query + <pad> x 10 + "\\n"``
(``process_queries``: ten query augmentation tokens, the tokenizer's pad token). Every text is a query. vLLM runs it
as the bundled backend's RblnColPaliModel (backend/graph/architectures/colpali.py: the projection's bias,
bidirectional attention), which returns every prompt token's normalized projection, image tokens included, as
transformers does.

Imports: errors, models (files, spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import read_json
from rbln_retrieval.models.spec import Checkpoint, FamilySpec, Scoring

ARCH = "ColPaliForRetrieval"
BUNDLED_MODEL = "RblnColPaliModel"  # rbln_retrieval.backend.graph.architectures.colpali defines it
AUGMENTATION_TOKENS = 10  # ColPaliProcessor's query suffix: its query augmentation token ten times


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    vlm = ckpt.config.get("vlm_config") or {}
    text = ckpt.config.get("text_config") or vlm.get("text_config") or {}
    vision = vlm.get("vision_config") or {}
    dim = int(ckpt.config.get("embedding_dim") or 0)
    image_size = int(vision.get("image_size") or 0)
    positions = int(text.get("max_position_embeddings") or 0)
    if not (dim and image_size and positions):
        raise ModelNotSupportedError(
            f"{ckpt.path} is a {ARCH} checkpoint whose config.json lacks embedding_dim, "
            "vlm_config.vision_config.image_size or the text model's max_position_embeddings."
        )
    processor = read_json(ckpt.path / "processor_config.json")
    processor = processor if isinstance(processor, dict) else {}
    tokens = read_json(ckpt.path / "tokenizer_config.json")
    tokens = tokens if isinstance(tokens, dict) else {}
    pad = _token(tokens, "pad_token", "<pad>")
    query = _token(tokens, "bos_token", "<bos>") + str(processor.get("query_prefix", "Question: "))
    # The suffix is appended after truncation: a query's prompt, suffix included, fits the text model's positions.
    suffix = pad * AUGMENTATION_TOKENS + "\n"
    max_length = positions - AUGMENTATION_TOKENS - 1
    if ckpt.user_max_length is not None:
        if not 0 < ckpt.user_max_length <= max_length:
            raise ValueError(f"max_length={ckpt.user_max_length} is outside 1..{max_length} for {ckpt.path}.")
        max_length = ckpt.user_max_length
    return {
        "architecture": ARCH,
        "hidden_size": dim,
        "max_length": max_length,
        "normalize": True,
        "query_prompt": query,
        "document_prompt": query,
        "text_suffix": suffix,
        "prompt_holds_special_tokens": True,
        "image_size": image_size,
        "image_prompt": str(processor.get("visual_prompt_prefix", "Describe the image.")) + "\n",
        "hf_overrides": {"architectures": [BUNDLED_MODEL]},
    }


def _token(tokenizer_config: dict[str, Any], name: str, default: str) -> str:
    value = tokenizer_config.get(name) or default
    return str(value.get("content", default) if isinstance(value, dict) else value)


SPEC = FamilySpec(
    name="colpali",
    architectures=frozenset({ARCH}),
    preset=_preset,
    scoring=Scoring(compares="multi_vector"),
    outputs=("multi_vector",),
    refuse_output=(
        "{model} is a ColPali model with no {missing}: it gives token vectors only; ask for "
        "output='multi_vector' (embed_images for pages, embed for queries), or score and rerank pages with "
        "score_images and rerank_images."
    ),
    images=True,
    bundled_model=BUNDLED_MODEL,
)
