"""Model families: read a model directory and decide how it embeds or scores.

The one table of retrieval presets. Everything is read from the directory (``config.json`` plus the
sentence-transformers files ``modules.json``, ``1_Pooling/config.json``, ``config_sentence_transformers.json``,
``sentence_bert_config.json``); the model's own prompts and pooling win over our defaults.

Imports: errors, models (files, family_prompts, multimodal, splade).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.family_prompts import QWEN3_DEFAULT_TASK, default_document_prompt, default_query_prompt
from rbln_retrieval.models.files import (
    Pooling,
    colbert_dim,
    dense_output_width,
    is_pylate,
    read_json,
    sentence_transformers_modules,
    st_pooling,
)
from rbln_retrieval.models.multimodal import IMAGE_TEXT_ARCHS, check_max_length, image_text_preset, refusal
from rbln_retrieval.models.splade import SPLADE_ARCHS, SPLADE_OVERRIDES, check_splade, is_masked_lm

logger = logging.getLogger(__name__)

FamilyName = Literal[
    "qwen3-embedding",
    "qwen3-reranker",
    "bi-encoder",
    "cross-encoder",
    "bge-m3",
    "gte-new",
    "nomic",
    "embeddinggemma",
    "colbert",
    "splade",
    "clip",
    "siglip",
]

# vLLM turns the causal LM's vocabulary head into one row, logit(yes) - logit(no); sigmoid of it is P(yes).
QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}

_BI_ENCODER_ARCHS = {"BertModel", "RobertaModel", "XLMRobertaModel", "ModernBertModel"}
_CROSS_ENCODER_ARCHS = {
    "BertForSequenceClassification",
    "RobertaForSequenceClassification",
    "XLMRobertaForSequenceClassification",
    "ModernBertForSequenceClassification",
    "Qwen3ForSequenceClassification",
}
_QWEN3_ARCHS = {"Qwen3ForCausalLM", "Qwen3Model"}
_ROBERTA_TYPES = {"roberta", "xlm-roberta"}
# BAAI/bge-m3 is an XLM-R bi-encoder that ships its sparse and ColBERT heads beside the weights; vLLM runs all
# three outputs as BgeM3EmbeddingModel.
BGE_M3_HEADS = ("sparse_linear.pt", "colbert_linear.pt")
BGE_M3_OVERRIDES = {"architectures": ["BgeM3EmbeddingModel"]}
# BERT-like encoders with rope whose config class ships as code (config.json's auto_map): vLLM asserts that class
# by name, so they need trust_remote_code. GTE-new (Alibaba-NLP/gte-*-v1.5, gte-multilingual-base) runs as vLLM's
# GteNewModel; Nomic (nomic-embed-text-v1/v1.5) as NomicBertModel, with task prefixes and (v1.5) matryoshka.
_REMOTE_CODE_ARCHS: dict[str, FamilyName] = {"NewModel": "gte-new", "NomicBertModel": "nomic"}
GTE_NEW_OVERRIDES = {"architectures": ["GteNewModel"]}
# EmbeddingGemma: a bidirectional Gemma3 encoder whose sentence-transformers Dense layers project the mean-pooled
# vector; vLLM runs it as Gemma3TextModel and applies the Dense layers in its embedding head.
_EMBEDDINGGEMMA_ARCHS = {"Gemma3TextModel"}
# The sizes google/embeddinggemma-300m was trained to be truncated to (its model card), for checkpoints that
# declare none in config.json's ``matryoshka_dimensions`` (the key vLLM reads).
EMBEDDINGGEMMA_MATRYOSHKA = (768, 512, 256, 128)
# colbert-ir/colbertv2.0's layout: a BERT under "bert." and a bias-free projection "linear" in one safetensors file;
# vLLM runs it as ColBERTModel, whose only output is the normalized projection of every token (pooling task
# "token_embed"). PyLate checkpoints (a sentence-transformers Dense module, [Q]/[D] prefixes) are not among them.
_COLBERT_ARCHS = {"HF_ColBERT"}


@dataclass(frozen=True)
class ModelFamily:
    """How one model directory is turned into vectors or scores."""

    name: FamilyName
    architecture: str
    hidden_size: int  # the width of the vectors it returns (after any sentence-transformers Dense projection)
    max_length: int
    pooling: Pooling | None = None  # bi-encoders only
    normalize: bool = True
    query_prompt: str = ""  # literal prefix for queries (Qwen3: the instruction template, formatted)
    document_prompt: str = ""
    default_instruction: str | None = None  # Qwen3 task description (embedding and reranker)
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()  # the only sizes ``dimensions`` may take; empty: any up to the width
    uses_token_type_ids: bool = False
    kv_bytes_per_token: int = 0  # causal models only: KV cache per token at fp32, for sizing the cache
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    config_code: str | None = None  # auto_map reference of a config class shipped as code (needs trust_remote_code)
    image_size: int = 0  # image-text models (models/multimodal.py): the vision tower's square input; 0: texts only
    pad_text_to_max_length: bool = False  # SigLIP pools the last position of a text padded to max_length

    def __post_init__(self) -> None:
        # A family rebuilt from a server's JSON description gets a list; equal families must compare equal.
        object.__setattr__(self, "matryoshka_dimensions", tuple(self.matryoshka_dimensions))

    @property
    def is_cross_encoder(self) -> bool:
        return self.name in ("cross-encoder", "qwen3-reranker")

    @property
    def pooling_task(self) -> Literal["embed", "classify"]:
        return "classify" if self.is_cross_encoder else "embed"

    @property
    def gives_dense(self) -> bool:
        """Whether it has a pooled dense vector: ColBERT gives token vectors only, SPLADE one sparse vector."""
        return self.name not in ("colbert", "splade")

    @property
    def embeds_images(self) -> bool:
        """Images and texts embed into one space (CLIP, SigLIP)."""
        return self.image_size > 0

    @property
    def late_interaction_only(self) -> bool:
        """Token vectors are this family's only output: it scores by MaxSim and has no pooled vector."""
        return self.name == "colbert"


def _max_length(model_dir: Path, config: dict[str, Any], user_max_length: int | None) -> int:
    limits = []
    # GPT-2 style configs (Nomic) name it n_positions; vLLM takes the smaller where both are given.
    positions = min((config[k] for k in ("max_position_embeddings", "n_positions") if config.get(k)), default=None)
    if positions:
        # RoBERTa-style models number positions from padding_idx + 1.
        offset = config.get("pad_token_id", 1) + 1 if config.get("model_type") in _ROBERTA_TYPES else 0
        limits.append(positions - offset)
    st_config = read_json(model_dir / "sentence_bert_config.json")
    if isinstance(st_config, dict) and st_config.get("max_seq_length"):
        limits.append(int(st_config["max_seq_length"]))
    if not limits:
        raise ModelNotSupportedError(f"{model_dir} declares no maximum sequence length (max_position_embeddings).")
    model_limit = min(limits)
    if user_max_length is None:
        return int(model_limit)
    if not 0 < user_max_length <= max(limits):
        raise ValueError(f"max_length={user_max_length} is outside 1..{max(limits)} for {model_dir}.")
    return user_max_length


def _qwen3_task(query_prompt: str) -> str | None:
    """Recover the task description from a Qwen3 query prompt such as 'Instruct: <task>\\nQuery:'."""
    if query_prompt.startswith("Instruct: ") and query_prompt.endswith("\nQuery:"):
        return query_prompt[len("Instruct: ") : -len("\nQuery:")]
    return None


def detect_family(model_dir: str | Path, *, max_length: int | None = None, family: str | None = None) -> ModelFamily:
    """Read ``model_dir`` and return its preset, or raise ModelNotSupportedError naming what is missing."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelNotSupportedError(f"Model directory {str(model_dir)!r} does not exist.")
    config = read_json(model_dir / "config.json")
    if not isinstance(config, dict):
        raise ModelNotSupportedError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    architectures = config.get("architectures") or []
    arch = architectures[0] if architectures else ""
    if refused := refusal(model_dir, arch):
        raise refused
    if arch in IMAGE_TEXT_ARCHS:
        preset = image_text_preset(model_dir, config, arch)
        preset["max_length"] = check_max_length(model_dir, preset["max_length"], max_length)
        return ModelFamily(**preset)
    modules = sentence_transformers_modules(model_dir)
    st_config = read_json(model_dir / "config_sentence_transformers.json")
    prompts: dict[str, str] = (st_config or {}).get("prompts") or {} if isinstance(st_config, dict) else {}
    pooling = st_pooling(model_dir, modules)
    name = family or _family_name(arch, pooling, model_dir)
    common: dict[str, Any] = {
        "architecture": arch,
        "hidden_size": int(config.get("hidden_size") or config.get("n_embd") or 0),  # n_embd: GPT-2 style (Nomic)
        "max_length": _max_length(model_dir, config, max_length),
        "hf_overrides": _config_fixes(config),
    }
    causal: dict[str, Any] = {"kv_bytes_per_token": _kv_bytes_per_token(config)}

    if name == "qwen3-reranker":
        return ModelFamily(
            name="qwen3-reranker",
            default_instruction=QWEN3_DEFAULT_TASK,
            **causal,
            **{**common, "hf_overrides": {**common["hf_overrides"], **QWEN3_RERANKER_OVERRIDES}},
        )
    if name == "cross-encoder":
        num_labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
        if num_labels != 1:
            raise ModelNotSupportedError(
                f"{model_dir} is a classifier with {num_labels} labels; a reranker needs exactly one relevance logit."
            )
        return ModelFamily(name="cross-encoder", uses_token_type_ids=config.get("type_vocab_size", 0) > 1, **common)
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    document_prompt = prompts.get("document", prompts.get("passage", ""))
    if name == "qwen3-embedding":
        query_prompt = prompts.get("query", default_query_prompt("qwen3-embedding"))
        return ModelFamily(
            name="qwen3-embedding",
            pooling="LAST",
            normalize=True,
            query_prompt=query_prompt,
            document_prompt=document_prompt,
            default_instruction=_qwen3_task(query_prompt) or QWEN3_DEFAULT_TASK,
            matryoshka=True,
            **causal,
            # The Qwen3 configs lack vLLM's matryoshka flag (QwenLM/Qwen3-Embedding#85).
            **{**common, "hf_overrides": {**common["hf_overrides"], "is_matryoshka": True}},
        )
    if name in ("gte-new", "nomic"):
        return _remote_code_family(name, model_dir, config, pooling, prompts, common)
    if name == "embeddinggemma":
        return _embeddinggemma(model_dir, config, modules, prompts, common)
    if name == "colbert":
        return ModelFamily(
            name="colbert",
            uses_token_type_ids=config.get("type_vocab_size", 0) > 1,
            **{**common, "hidden_size": colbert_dim(model_dir, config)},
        )
    if name == "splade":
        check_splade(model_dir, arch, modules)
        return ModelFamily(
            name="splade",
            normalize=False,
            query_prompt=prompts.get("query", ""),
            document_prompt=document_prompt,
            uses_token_type_ids=config.get("type_vocab_size", 0) > 1,
            # The sparse vector spans the vocabulary.
            **{**common, "hidden_size": int(config.get("vocab_size", 0)), "hf_overrides": SPLADE_OVERRIDES},
        )
    if name == "bge-m3":
        if missing := [head for head in BGE_M3_HEADS if not (model_dir / head).is_file()]:
            raise ModelNotSupportedError(f"{model_dir} is not a bge-m3 checkpoint: it lacks {', '.join(missing)}.")
        common["hf_overrides"] = {**common["hf_overrides"], **BGE_M3_OVERRIDES}
    if pooling is None:
        # sentence-transformers' own default when a checkpoint ships no pooling module.
        logger.info("%s declares no pooling module; using mean pooling as sentence-transformers does.", model_dir)
        pooling = "MEAN"
    return ModelFamily(
        name="bge-m3" if name == "bge-m3" else "bi-encoder",
        pooling=pooling,
        normalize=normalize,
        query_prompt=prompts.get("query", ""),
        document_prompt=document_prompt,
        uses_token_type_ids=config.get("type_vocab_size", 0) > 1,
        # vLLM's embedding head applies a checkpoint's sentence-transformers Dense layers: they set the width.
        **{**common, "hidden_size": dense_output_width(model_dir, modules, common["hidden_size"])},
    )


def _embeddinggemma(
    model_dir: Path,
    config: dict[str, Any],
    modules: list[dict[str, Any]],
    prompts: dict[str, str],
    common: dict[str, Any],
) -> ModelFamily:
    """EmbeddingGemma as sentence-transformers runs it: bidirectional Gemma3, mean pooling (with the prompt), the
    Dense projection, then matryoshka truncation and normalization."""
    if common["architecture"] not in _EMBEDDINGGEMMA_ARCHS:
        raise ModelNotSupportedError(
            f"{model_dir} is not an EmbeddingGemma checkpoint (architecture {common['architecture'] or 'none'!r})."
        )
    if config.get("use_bidirectional_attention") is not True:
        raise ModelNotSupportedError(
            f"{model_dir} is a causal Gemma3 model (use_bidirectional_attention is not true); rbln-retrieval runs "
            "Gemma3 only as EmbeddingGemma's bidirectional encoder."
        )
    pooling_dirs = [m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")] or ["1_Pooling"]
    pooling_config = read_json(model_dir / pooling_dirs[0] / "config.json")
    if isinstance(pooling_config, dict) and pooling_config.get("include_prompt") is False:
        # vLLM pools every token of the prompt; leaving the prompt's tokens out is not expressible there.
        raise ModelNotSupportedError(
            f"{model_dir}'s pooling leaves the prompt out (include_prompt is false), which vLLM cannot do."
        )
    pooling = st_pooling(model_dir, modules)
    if isinstance(pooling_config, dict) and pooling is None:
        raise ModelNotSupportedError(
            f"{model_dir}'s pooling module uses none of the modes rbln-retrieval runs (mean, CLS, last token)."
        )
    width = dense_output_width(model_dir, modules, int(config.get("hidden_size", 0)))
    declared = config.get("matryoshka_dimensions")
    sizes = tuple(declared) if declared else tuple(d for d in EMBEDDINGGEMMA_MATRYOSHKA if d <= width)
    if not all(isinstance(d, int) and 1 <= d <= width for d in sizes):
        raise ModelNotSupportedError(
            f"{model_dir} declares matryoshka_dimensions {list(sizes)}, not all within 1..{width}."
        )
    overrides = {"matryoshka_dimensions": list(sizes)} if sizes else {"is_matryoshka": True}
    return ModelFamily(
        name="embeddinggemma",
        pooling=pooling or "MEAN",  # sentence-transformers' default without a pooling module
        normalize=any(m.get("type", "").endswith("Normalize") for m in modules),
        query_prompt=prompts.get("query", default_query_prompt("embeddinggemma")),
        document_prompt=prompts.get("document", prompts.get("passage", default_document_prompt("embeddinggemma"))),
        matryoshka=True,
        matryoshka_dimensions=sizes,
        **{**common, "hidden_size": width, "hf_overrides": {**common["hf_overrides"], **overrides}},
    )


def _family_name(arch: str, pooling: Pooling | None, model_dir: Path) -> FamilyName:
    if arch in _COLBERT_ARCHS:
        return "colbert"
    if is_pylate(model_dir, sentence_transformers_modules(model_dir)):
        raise ModelNotSupportedError(
            f"{model_dir} is a PyLate ColBERT checkpoint ({arch or 'no architecture'} with a Dense projection and "
            "[Q]/[D] prefixes), which rbln-retrieval does not support; ColBERT checkpoints in colbert-ir's layout "
            "(architecture HF_ColBERT) are."
        )
    if arch in _CROSS_ENCODER_ARCHS:
        return "cross-encoder"
    if is_masked_lm(arch):  # what a retrieval engine computes from a masked-LM head; check_splade refuses the rest
        return "splade"
    if arch in _QWEN3_ARCHS:
        # A Qwen3 checkpoint with a sentence-transformers pooling module is Qwen3-Embedding; the original
        # Qwen3-Reranker is a bare causal LM whose yes/no logits are the score.
        return "qwen3-embedding" if pooling is not None else "qwen3-reranker"
    if arch in _REMOTE_CODE_ARCHS:
        return _REMOTE_CODE_ARCHS[arch]
    if arch in _EMBEDDINGGEMMA_ARCHS:
        return "embeddinggemma"
    if arch in _BI_ENCODER_ARCHS:
        return "bge-m3" if all((model_dir / head).is_file() for head in BGE_M3_HEADS) else "bi-encoder"
    supported = sorted(
        _BI_ENCODER_ARCHS
        | _CROSS_ENCODER_ARCHS
        | _QWEN3_ARCHS
        | set(_REMOTE_CODE_ARCHS)
        | _EMBEDDINGGEMMA_ARCHS
        | _COLBERT_ARCHS
        | SPLADE_ARCHS
        | set(IMAGE_TEXT_ARCHS)
    )
    raise ModelNotSupportedError(
        f"{model_dir} has architecture {arch or 'none'!r}, which rbln-retrieval does not support "
        f"(supported: {', '.join(supported)})."
    )


def _remote_code_family(
    name: str,
    model_dir: Path,
    config: dict[str, Any],
    pooling: Pooling | None,
    prompts: dict[str, str],
    common: dict[str, Any],
) -> ModelFamily:
    config_code = (config.get("auto_map") or {}).get("AutoConfig")
    if not config_code:
        raise ModelNotSupportedError(
            f"{model_dir} is a {common['architecture']} checkpoint without an auto_map AutoConfig entry naming the "
            "config class it ships as code."
        )
    overrides = dict(common["hf_overrides"])
    if name == "gte-new":
        overrides |= GTE_NEW_OVERRIDES
    else:
        # Nomic's configs lack vLLM's matryoshka flag; v1.5 was trained for 768..64 dimensions.
        overrides["is_matryoshka"] = True
    return ModelFamily(
        name="gte-new" if name == "gte-new" else "nomic",
        pooling=pooling or ("CLS" if name == "gte-new" else "MEAN"),
        query_prompt=prompts.get("query", default_query_prompt(name)),
        document_prompt=prompts.get("document", prompts.get("passage", default_document_prompt(name))),
        matryoshka=name == "nomic",
        uses_token_type_ids=config.get("type_vocab_size", 0) > 1,
        config_code=config_code,
        **{**common, "hf_overrides": overrides},
    )


def check_remote_code(model_dir: str | Path, family: ModelFamily, *, trust_remote_code: bool) -> None:
    """Refuse, in one sentence, a family whose config class is code shipped with the model unless the caller trusts
    it, or whose code file is missing from the model directory."""
    if family.config_code is None:
        return
    if not trust_remote_code:
        raise ModelNotSupportedError(
            f"{model_dir} is a {family.architecture} checkpoint ({family.name}) whose config class is code shipped "
            f"with the model ({family.config_code}); pass trust_remote_code=True if you trust its source."
        )
    module = family.config_code.partition(".")[0]
    if "--" not in family.config_code and not (Path(model_dir) / f"{module}.py").is_file():
        raise ModelNotSupportedError(
            f"{model_dir} names its config class {family.config_code}, but {module}.py is not in the directory."
        )


def _config_fixes(config: dict[str, Any]) -> dict[str, Any]:
    """hf_overrides that let vLLM 0.30 load configs written by transformers 5.x."""
    if config.get("model_type") in _ROBERTA_TYPES and "position_embedding_type" not in config:
        # transformers 5.x omits it; vLLM's RoBERTa code reads it.
        return {"position_embedding_type": "absolute"}
    return {}


def _kv_bytes_per_token(config: dict[str, Any]) -> int:
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return int(2 * config.get("num_hidden_layers", 1) * kv_heads * head_dim * 4)
