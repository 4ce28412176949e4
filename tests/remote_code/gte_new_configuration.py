"""Minimal stand-in for Alibaba-NLP/new-impl's configuration.py (copied into tiny GTE-new models as
configuration.py): the class name vLLM asserts (NewConfig), model_type "new", and the fields vLLM and the
reference read, with the published defaults."""

from transformers import PretrainedConfig


class NewConfig(PretrainedConfig):
    model_type = "new"

    def __init__(
        self,
        vocab_size=30528,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=0,
        layer_norm_type="layer_norm",
        layer_norm_eps=1e-12,
        position_embedding_type="rope",
        rope_theta=10000.0,
        rope_scaling=None,
        pack_qkv=True,
        logn_attention_scale=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.layer_norm_type = layer_norm_type
        self.layer_norm_eps = layer_norm_eps
        self.position_embedding_type = position_embedding_type
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.pack_qkv = pack_qkv
        self.logn_attention_scale = logn_attention_scale
