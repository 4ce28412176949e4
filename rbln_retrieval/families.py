"""Model families: read a model directory and decide how it embeds or scores.

The one table of retrieval presets. Everything is read from the directory (``config.json`` plus the
sentence-transformers files ``modules.json``, ``1_Pooling/config.json``, ``config_sentence_transformers.json``,
``sentence_bert_config.json``); the model's own prompts and pooling win over our defaults.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.prompts import QWEN3_DEFAULT_TASK, default_query_prompt

logger = logging.getLogger(__name__)

Pooling = Literal["MEAN", "CLS", "LAST"]
FamilyName = Literal["qwen3-embedding", "qwen3-reranker", "bi-encoder", "cross-encoder", "bge-m3", "colbert"]

# vLLM turns the causal LM's vocabulary head into one row, logit(yes) - logit(no); sigmoid of it is P(yes).
QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}

_ST_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
    "pooling_mode_lasttoken": "LAST",
}
_ST_POOLING_MODES: dict[str, Pooling] = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}
_BI_ENCODER_ARCHS = {"BertModel", "RobertaModel", "XLMRobertaModel", "ModernBertModel", "NomicBertModel"}
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
# colbert-ir/colbertv2.0's layout: a BERT under "bert." and a bias-free projection "linear" in one safetensors file;
# vLLM runs it as ColBERTModel, whose only output is the normalized projection of every token (pooling task
# "token_embed"). PyLate checkpoints (a sentence-transformers Dense module, [Q]/[D] prefixes) are not among them.
_COLBERT_ARCHS = {"HF_ColBERT"}
_COLBERT_PROJECTION = "linear.weight"


@dataclass(frozen=True)
class ModelFamily:
    """How one model directory is turned into vectors or scores."""

    name: FamilyName
    architecture: str
    hidden_size: int
    max_length: int
    pooling: Pooling | None = None  # bi-encoders only
    normalize: bool = True
    query_prompt: str = ""  # literal prefix for queries (Qwen3: the instruction template, formatted)
    document_prompt: str = ""
    default_instruction: str | None = None  # Qwen3 task description (embedding and reranker)
    matryoshka: bool = False
    uses_token_type_ids: bool = False
    kv_bytes_per_token: int = 0  # causal models only: KV cache per token at fp32, for sizing the cache
    hf_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cross_encoder(self) -> bool:
        return self.name in ("cross-encoder", "qwen3-reranker")

    @property
    def pooling_task(self) -> Literal["embed", "classify"]:
        return "classify" if self.is_cross_encoder else "embed"

    @property
    def late_interaction_only(self) -> bool:
        """Token vectors are this family's only output: it scores by MaxSim and has no pooled vector."""
        return self.name == "colbert"


def _read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        data: dict[str, Any] | list[Any] = json.load(f)
    return data


def _sentence_transformers_modules(model_dir: Path) -> list[dict[str, Any]]:
    modules = _read_json(model_dir / "modules.json")
    return modules if isinstance(modules, list) else []


def _st_pooling(model_dir: Path, modules: list[dict[str, Any]]) -> Pooling | None:
    pooling_dirs = [m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")]
    for sub in pooling_dirs or ["1_Pooling"]:
        cfg = _read_json(model_dir / sub / "config.json")
        if not isinstance(cfg, dict):
            continue
        if mode := cfg.get("pooling_mode"):  # newer sentence-transformers writes one string
            return _ST_POOLING_MODES.get(mode)
        for flag, pooling in _ST_POOLING_FLAGS.items():
            if cfg.get(flag):
                return pooling
    return None


def _max_length(model_dir: Path, config: dict[str, Any], user_max_length: int | None) -> int:
    limits = []
    positions = config.get("max_position_embeddings")
    if positions:
        # RoBERTa-style models number positions from padding_idx + 1.
        offset = config.get("pad_token_id", 1) + 1 if config.get("model_type") in _ROBERTA_TYPES else 0
        limits.append(positions - offset)
    st_config = _read_json(model_dir / "sentence_bert_config.json")
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
    config = _read_json(model_dir / "config.json")
    if not isinstance(config, dict):
        raise ModelNotSupportedError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    architectures = config.get("architectures") or []
    arch = architectures[0] if architectures else ""
    modules = _sentence_transformers_modules(model_dir)
    st_config = _read_json(model_dir / "config_sentence_transformers.json")
    prompts: dict[str, str] = (st_config or {}).get("prompts") or {} if isinstance(st_config, dict) else {}
    pooling = _st_pooling(model_dir, modules)
    name = family or _family_name(arch, pooling, model_dir)
    common: dict[str, Any] = {
        "architecture": arch,
        "hidden_size": int(config.get("hidden_size", 0)),
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
    if name == "colbert":
        return ModelFamily(
            name="colbert",
            uses_token_type_ids=config.get("type_vocab_size", 0) > 1,
            **{**common, "hidden_size": _colbert_dim(model_dir, config)},
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
        **common,
    )


def _colbert_dim(model_dir: Path, config: dict[str, Any]) -> int:
    """Width of the token vectors: the config's, where it names one (as vLLM reads it), else the projection's rows."""
    if dim := config.get("colbert_dim") or config.get("dim") or config.get("projection_dim"):
        return int(dim)
    from safetensors import SafetensorError, safe_open

    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(path, framework="numpy") as weights:
                if _COLBERT_PROJECTION in weights.keys():  # noqa: SIM118 - safe_open is not a mapping
                    return int(weights.get_slice(_COLBERT_PROJECTION).get_shape()[0])
        except (SafetensorError, OSError):
            continue  # unreadable files are named by check_weights/unreadable_weights at engine start
    raise ModelNotSupportedError(
        f"{model_dir} is an HF_ColBERT checkpoint without its projection: "
        f"no {_COLBERT_PROJECTION!r} in its safetensors."
    )


def _is_pylate(model_dir: Path, modules: list[dict[str, Any]]) -> bool:
    st_config = _read_json(model_dir / "config_sentence_transformers.json")
    prefixes = isinstance(st_config, dict) and ("query_prefix" in st_config or "document_prefix" in st_config)
    return prefixes or any(m.get("type", "").startswith("pylate.") for m in modules)


def _family_name(arch: str, pooling: Pooling | None, model_dir: Path) -> FamilyName:
    if arch in _COLBERT_ARCHS:
        return "colbert"
    if _is_pylate(model_dir, _sentence_transformers_modules(model_dir)):
        raise ModelNotSupportedError(
            f"{model_dir} is a PyLate ColBERT checkpoint ({arch or 'no architecture'} with a Dense projection and "
            "[Q]/[D] prefixes), which rbln-retrieval does not support; ColBERT checkpoints in colbert-ir's layout "
            "(architecture HF_ColBERT) are."
        )
    if arch in _CROSS_ENCODER_ARCHS:
        return "cross-encoder"
    if arch in _QWEN3_ARCHS:
        # A Qwen3 checkpoint with a sentence-transformers pooling module is Qwen3-Embedding; the original
        # Qwen3-Reranker is a bare causal LM whose yes/no logits are the score.
        return "qwen3-embedding" if pooling is not None else "qwen3-reranker"
    if arch in _BI_ENCODER_ARCHS:
        return "bge-m3" if all((model_dir / head).is_file() for head in BGE_M3_HEADS) else "bi-encoder"
    supported = sorted(_BI_ENCODER_ARCHS | _CROSS_ENCODER_ARCHS | _QWEN3_ARCHS | _COLBERT_ARCHS)
    raise ModelNotSupportedError(
        f"{model_dir} has architecture {arch or 'none'!r}, which rbln-retrieval does not support "
        f"(supported: {', '.join(supported)})."
    )


def _config_fixes(config: dict[str, Any]) -> dict[str, Any]:
    """hf_overrides that let vLLM 0.32 load configs written by current transformers."""
    if config.get("model_type") in _ROBERTA_TYPES and "position_embedding_type" not in config:
        # transformers 5.x omits it; vLLM's RoBERTa code reads it.
        return {"position_embedding_type": "absolute"}
    return {}


def _kv_bytes_per_token(config: dict[str, Any]) -> int:
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return int(2 * config.get("num_hidden_layers", 1) * kv_heads * head_dim * 4)


def check_weights(model_dir: str | Path, *, allow_pickle: bool) -> None:
    """Refuse pickle-only checkpoints (loading them can run arbitrary code) unless the caller trusts them."""
    model_dir = Path(model_dir)
    if allow_pickle or any(model_dir.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickles:
        raise ModelNotSupportedError(
            f"{model_dir} has only pickle weights ({', '.join(pickles)}), which can run code when loaded; "
            "convert them to safetensors or pass allow_pickle=True if you trust the source."
        )
    raise ModelNotSupportedError(f"{model_dir} has no weights (*.safetensors).")


def unreadable_weights(model_dir: str) -> str | None:
    """One sentence naming a safetensors file whose header cannot be read, or None when all of them can."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(path, framework="numpy"):
                pass
        except (SafetensorError, OSError) as exc:
            return f"{path.name} is not a readable safetensors file ({exc})."
    return None
