"""Independent references written with plain transformers (no vLLM, no rbln_retrieval tokenization)."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@cache
def _load(kind: str, path: str):
    loader = {
        "base": AutoModel,
        "causal": AutoModelForCausalLM,
        "seq-cls": AutoModelForSequenceClassification,
        "mlm": AutoModelForMaskedLM,
    }[kind]
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
    """One text at a time (no padding): pooled hidden states of the base model (for remote-code families, whose
    modeling code is not available here, of rope_encoder's forward)."""
    if _model_type(path) in ROPE_ENCODERS:
        # The tokenizer is a stock one; transformers reads the config (remote code) only to find its class.
        tokenizer, model = AutoTokenizer.from_pretrained(path, trust_remote_code=True), rope_encoder(path)
    else:
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


@torch.no_grad()
def splade(path: str, texts: list[str], *, max_length: int, batch_size: int = 2) -> list[dict[int, float]]:
    """sentence-transformers' SparseEncoder recipe (MLMTransformer, then SpladePooling with max and relu), batched
    with padding as it encodes: per vocabulary id the largest log(1 + relu(logit)) over the tokens the attention
    mask keeps, [CLS] and [SEP] included; the ids above zero as {token_id: weight}."""
    tokenizer, model = _load("mlm", path)
    vectors: list[dict[int, float]] = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[start : start + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        values = torch.log1p(torch.relu(model(**enc).logits)) * enc["attention_mask"].unsqueeze(-1)
        for row in values.max(dim=1).values:
            ids = torch.nonzero(row > 0).flatten().tolist()
            vectors.append(dict(zip(ids, row[ids].tolist())))
    return vectors


def colbert_score(query: np.ndarray, document: np.ndarray) -> float:
    """FlagEmbedding's BGEM3 ``colbert_score``: the sum over query vectors of their best dot product with any
    document vector, divided by the number of query vectors."""
    q, p = torch.from_numpy(query), torch.from_numpy(document)
    return (torch.einsum("in,jn->ij", q, p).max(-1).values.sum() / q.size(0)).item()


# -- remote-code encoders with rope (GTE-new, Nomic), written from their published modeling code ----------------
# Per family: where each weight lives in the checkpoint, the MLP's activation, and how config fields are named.
ROPE_ENCODERS = {
    "new": {  # Alibaba-NLP/new-impl modeling.py: NewEmbeddings, NewLayer (post-norm), NewGatedMLP (GeGLU)
        "embedding_ln": "embeddings.LayerNorm",
        "layer": "encoder.layer.{}",
        "qkv": "attention.qkv_proj",
        "out": "attention.o_proj",
        "attn_ln": "attn_ln",
        "mlp_ln": "mlp_ln",
        "down": "mlp.down_proj",
        "activation": lambda x: F.gelu(x),  # hidden_act "gelu": the exact erf form (ACT2FN["gelu"])
    },
    "nomic_bert": {  # nomic-ai/nomic-bert-2048 modeling_hf_nomic_bert.py: NomicBertBlock (post-norm), SwiGLU MLP
        "embedding_ln": "emb_ln",
        "layer": "encoder.layers.{}",
        "qkv": "attn.Wqkv",
        "out": "attn.out_proj",
        "attn_ln": "norm1",
        "mlp_ln": "norm2",
        "down": "mlp.fc2",
        "activation": F.silu,
    },
}


def _model_type(path: str) -> str:
    with open(f"{path}/config.json", encoding="utf-8") as f:
        return json.load(f).get("model_type", "")


def _rope_inverse_frequencies(config: dict, head_dim: int) -> torch.Tensor:
    """GTE-new: base rope_theta, with fixed NTK scaling (new-impl's NTKScalingRotaryEmbedding: base * factor, then
    frequencies / factor^(2/dim)) when rope_scaling says "ntk"; Nomic: base rotary_emb_base over the rotated
    fraction of the head."""
    if config["model_type"] == "new":
        dim, base, scaling = head_dim, float(config["rope_theta"]), config.get("rope_scaling")
        factor = scaling["factor"] if scaling else 1.0
        assert not scaling or (scaling["type"] == "ntk" and scaling.get("mixed_b") is None)
        inv = 1.0 / ((base * factor) ** (torch.arange(0, dim, 2).float() / dim))
        return inv / factor ** (2 / dim)
    dim = int(head_dim * config["rotary_emb_fraction"])
    assert not config.get("rotary_emb_interleaved") and config.get("rotary_emb_scale_base") is None
    return 1.0 / (float(config["rotary_emb_base"]) ** (torch.arange(0, dim, 2).float() / dim))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved (GPT-NeoX) rope on the rotated dims of each head: x * cos + rotate_half(x) * sin."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)


@cache
def rope_encoder(path: str):
    """The encoder of a GTE-new or Nomic checkpoint as a function of input_ids (and token_type_ids), returning
    ``.last_hidden_state``: word (+ token type) embeddings and LayerNorm; per layer fused qkv, rope on q and k,
    softmax(q k^T / sqrt(head_dim)) v, output projection, residual and LayerNorm, gated MLP (act(gate) * up),
    residual and LayerNorm."""
    from safetensors.torch import load_file

    with open(f"{path}/config.json", encoding="utf-8") as f:
        config = json.load(f)
    names = ROPE_ENCODERS[config["model_type"]]
    w = load_file(f"{path}/model.safetensors")
    hidden = config.get("hidden_size") or config["n_embd"]
    heads = config.get("num_attention_heads") or config["n_head"]
    layers = config.get("num_hidden_layers") or config["n_layer"]
    eps = config.get("layer_norm_eps") or config["layer_norm_epsilon"]
    head_dim = hidden // heads
    inv_freq = _rope_inverse_frequencies(config, head_dim)

    def linear(x, name):
        return F.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))

    def norm(x, name):
        return F.layer_norm(x, (hidden,), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def gated_mlp(x, layer):
        if config["model_type"] == "new":  # one up_gate_proj without bias: [up; gate]
            up, gate = F.linear(x, w[f"{layer}.mlp.up_gate_proj.weight"]).chunk(2, dim=-1)
        else:  # fc11 is the value, fc12 the gate
            up, gate = linear(x, f"{layer}.mlp.fc11"), linear(x, f"{layer}.mlp.fc12")
        return linear(names["activation"](gate) * up, f"{layer}.{names['down']}")

    def forward(input_ids, token_type_ids=None, attention_mask=None):
        ids = input_ids[0]
        x = w["embeddings.word_embeddings.weight"][ids]
        if config.get("type_vocab_size", 0) > 0:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids[0]
            x = x + w["embeddings.token_type_embeddings.weight"][types]
        x = norm(x, names["embedding_ln"])
        angles = torch.outer(torch.arange(len(ids)).float(), inv_freq)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        for i in range(layers):
            layer = names["layer"].format(i)
            q, k, v = linear(x, f"{layer}.{names['qkv']}").view(len(ids), 3, heads, head_dim).unbind(1)
            q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
            context = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(len(ids), hidden)
            x = norm(x + linear(context, f"{layer}.{names['out']}"), f"{layer}.{names['attn_ln']}")
            x = norm(x + gated_mlp(x, layer), f"{layer}.{names['mlp_ln']}")
        return SimpleNamespace(last_hidden_state=x[None])

    return forward


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


def useful_flops(path: Path, lengths: list[int]) -> float:
    """FLOPs of each text alone at its exact length, through plain transformers (eager attention, so the
    counter sees its matmuls), on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    total = 0.0
    for n in sorted(set(lengths)):
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True), counter:
            model(input_ids=torch.ones(1, n, dtype=torch.long), attention_mask=torch.ones(1, n, dtype=torch.long))
        total += counter.get_total_flops() * lengths.count(n)
    return total
