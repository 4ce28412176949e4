"""Independent references written with plain transformers (no vLLM, no rbln_retrieval tokenization)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@cache
def _load(kind: str, path: str):
    loader = {"base": AutoModel, "causal": AutoModelForCausalLM, "seq-cls": AutoModelForSequenceClassification}[kind]
    return AutoTokenizer.from_pretrained(path), loader.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def embed(
    path: str,
    texts: list[str],
    *,
    pooling: str,
    max_length: int,
    prefix: str = "",
    normalize=True,
    dimensions: int | None = None,
) -> np.ndarray:
    """One text at a time (no padding): pooled hidden states of the base model."""
    tokenizer, model = _load("base", path)
    rows = []
    for text in texts:
        enc = tokenizer(prefix + text, truncation=True, max_length=max_length, return_tensors="pt")
        enc.pop("token_type_ids", None) if "token_type_ids" not in tokenizer.model_input_names else None
        hidden = model(**enc).last_hidden_state[0]
        vec = {"MEAN": hidden.mean(0), "CLS": hidden[0], "LAST": hidden[-1]}[pooling]
        if dimensions is not None:
            vec = vec[:dimensions]
        if normalize:
            vec = torch.nn.functional.normalize(vec, dim=0)
        rows.append(vec.numpy())
    return np.stack(rows)


@torch.no_grad()
def cross_encoder_scores(path: str, query: str, documents: list[str], *, max_length: int) -> list[float]:
    tokenizer, model = _load("seq-cls", path)
    scores = []
    for doc in documents:
        enc = tokenizer(query, doc, truncation=True, max_length=max_length, return_tensors="pt")
        scores.append(torch.sigmoid(model(**enc).logits[0, 0]).item())
    return scores


@torch.no_grad()
def qwen3_reranker_scores(
    path: str, query: str, documents: list[str], *, instruction: str, max_length: int
) -> list[float]:
    """The recipe from the Qwen3-Reranker model card: P(yes) from the LM head at the last position."""
    tokenizer, model = _load("causal", path)
    prefix = tokenizer.encode(QWEN3_RERANKER_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_RERANKER_SUFFIX, add_special_tokens=False)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    scores = []
    for doc in documents:
        pair = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
        middle = tokenizer(
            pair, add_special_tokens=False, truncation=True, max_length=max_length - len(prefix) - len(suffix)
        )["input_ids"]
        ids = torch.tensor([prefix + middle + suffix])
        logits = model(input_ids=ids).logits[0, -1]
        scores.append(torch.softmax(torch.stack([logits[no], logits[yes]]), 0)[1].item())
    return scores


@torch.no_grad()
def bge_m3(
    path: str, texts: list[str], *, max_length: int
) -> tuple[np.ndarray, list[dict[int, float]], list[np.ndarray]]:
    """Dense, sparse and multi-vector outputs as FlagEmbedding's BGEM3 computes them, one text at a time: dense is
    the normalized CLS row; sparse is relu(sparse_linear(h)) per token, cls/eos/pad/unk and zero weights left out,
    the largest weight kept per token id; multi-vector is colbert_linear(h) of every token but the first, each row
    normalized."""
    tokenizer, model = _load("base", path)
    hidden = model.config.hidden_size
    sparse_linear, colbert_linear = torch.nn.Linear(hidden, 1), torch.nn.Linear(hidden, hidden)
    sparse_linear.load_state_dict(torch.load(f"{path}/sparse_linear.pt", weights_only=True))
    colbert_linear.load_state_dict(torch.load(f"{path}/colbert_linear.pt", weights_only=True))
    unused = {
        tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[name])
        for name in ("cls_token", "eos_token", "pad_token", "unk_token")
        if name in tokenizer.special_tokens_map
    }
    dense, sparse, multi = [], [], []
    for text in texts:
        enc = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
        h = model(**enc).last_hidden_state[0]
        dense.append(torch.nn.functional.normalize(h[0], dim=-1).numpy())
        weights = torch.relu(sparse_linear(h)).squeeze(-1)
        lexical: dict[int, float] = {}
        for token, weight in zip(enc["input_ids"][0].tolist(), weights.tolist()):
            if token not in unused and weight > 0 and weight > lexical.get(token, 0.0):
                lexical[token] = weight
        sparse.append(lexical)
        multi.append(torch.nn.functional.normalize(colbert_linear(h[1:]), dim=-1).numpy())
    return np.stack(dense), sparse, multi


def colbert_score(query: np.ndarray, document: np.ndarray) -> float:
    """FlagEmbedding's BGEM3 ``colbert_score``: the sum over query vectors of their best dot product with any
    document vector, divided by the number of query vectors."""
    q, p = torch.from_numpy(query), torch.from_numpy(document)
    return (torch.einsum("in,jn->ij", q, p).max(-1).values.sum() / q.size(0)).item()


@cache
def _dense_layers(path: str) -> list[torch.Tensor]:
    """The weights of the sentence-transformers Dense modules, in pipeline order (bias-free, Identity activation,
    as EmbeddingGemma's)."""
    modules = json.loads(Path(path, "modules.json").read_text(encoding="utf-8"))
    folders = [m["path"] for m in modules if m["type"].endswith("Dense")]
    return [load_file(str(Path(path, folder, "model.safetensors")))["linear.weight"] for folder in folders]


@torch.no_grad()
def embeddinggemma(
    path: str, texts: list[str], *, prefix: str, max_length: int, dimensions: int | None = None
) -> np.ndarray:
    """google/embeddinggemma-300m's sentence-transformers recipe, one text at a time: the prompt prepended, the
    bidirectional Gemma3 forward, the mean over every token (prompt included), each Dense layer, matryoshka
    truncation, then normalization."""
    tokenizer, model = _load("base", path)
    assert model.config.use_bidirectional_attention
    rows = []
    for text in texts:
        enc = tokenizer(prefix + text, truncation=True, max_length=max_length, return_tensors="pt")
        enc.pop("token_type_ids", None)
        vec = model(**enc).last_hidden_state[0].mean(0)
        for weight in _dense_layers(path):
            vec = weight @ vec
        if dimensions is not None:
            vec = vec[:dimensions]
        rows.append(torch.nn.functional.normalize(vec, dim=0).numpy())
    return np.stack(rows)
