"""Minimal stand-in for nomic-ai/nomic-bert-2048's configuration_hf_nomic_bert.py (copied into tiny Nomic models):
the class name vLLM asserts (NomicBertConfig), a GPT-2 style config as the original, and the fields vLLM and the
reference read, with the published defaults."""

from transformers import GPT2Config


class NomicBertConfig(GPT2Config):
    model_type = "nomic_bert"

    def __init__(
        self,
        rotary_emb_fraction=0.0,
        qkv_proj_bias=True,
        rotary_emb_base=10_000,
        rotary_emb_scale_base=None,
        rotary_emb_interleaved=False,
        mlp_fc1_bias=True,
        mlp_fc2_bias=True,
        type_vocab_size=2,
        max_trained_positions=2048,
        **kwargs,
    ):
        self.rotary_emb_fraction = rotary_emb_fraction
        self.qkv_proj_bias = qkv_proj_bias
        self.rotary_emb_base = rotary_emb_base
        self.rotary_emb_scale_base = rotary_emb_scale_base
        self.rotary_emb_interleaved = rotary_emb_interleaved
        self.mlp_fc1_bias = mlp_fc1_bias
        self.mlp_fc2_bias = mlp_fc2_bias
        self.type_vocab_size = type_vocab_size
        self.max_trained_positions = max_trained_positions
        super().__init__(**kwargs)
