"""Independent references written with plain transformers (no vLLM, no rbln_retrieval tokenization)."""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
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


@torch.no_grad()
def colbert(path: str, texts: list[str], *, max_length: int, prefix: str = "") -> list[np.ndarray]:
    """ColBERT token vectors as vLLM's ColBERTModel computes them, one text at a time: BERT's last hidden state of
    every token ([CLS] and [SEP] included), the bias-free ``linear`` projection, each row L2-normalized. Like vLLM
    (and unlike the colbert-ir library) no [unused0]/[unused1] query/document marker is inserted and queries are
    not padded with [MASK] to 32 tokens."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(path)
    weights = load_file(f"{path}/model.safetensors")
    bert = BertModel(BertConfig.from_pretrained(path), add_pooling_layer=False).eval()
    bert.load_state_dict({k.removeprefix("bert."): v for k, v in weights.items() if k.startswith("bert.")})
    projection = weights["linear.weight"]
    rows = []
    for text in texts:
        enc = tokenizer(prefix + text, truncation=True, max_length=max_length, return_tensors="pt")
        hidden = bert(**enc).last_hidden_state[0]
        rows.append(torch.nn.functional.normalize(hidden @ projection.T, dim=-1).numpy())
    return rows


def colbert_maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's MaxSim: the sum over query vectors of their best dot product with any document vector."""
    q, d = torch.from_numpy(query), torch.from_numpy(document)
    return (q @ d.T).max(dim=-1).values.sum().item()
