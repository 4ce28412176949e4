"""SPLADE on vLLM: vLLM 0.30's BertSpladeSparseEmbeddingModel with two fixes, registered under its own name.

- Loading: vLLM's loader takes the MLM decoder from ``cls.predictions.decoder.{weight,bias}`` only. Checkpoints
  saved by transformers with safetensors hold neither: the decoder weight is tied to the word embeddings (not
  saved) and its bias is saved as ``cls.predictions.bias``; vLLM then refuses to start ("weights were not
  initialized"). Here the bias is read under its saved name and a tied decoder is the word embeddings, as
  transformers' BertForMaskedLM (and vLLM's own) ties them.
- Pooling: vLLM's SPLADE pooler drops a first [CLS] and last [SEP] when the config names their ids; the recipe
  (naver/splade, sentence-transformers' SpladePooling) max-pools every token the attention mask keeps, [CLS] and
  [SEP] included. The pooler keeps them here whatever the config says.

The pooler runs on the host from the step's hidden states, one request at a time: memory is bounded by one
request's ``[tokens, vocabulary]`` logits (512 x 30522 x 4 bytes = 62 MB for naver/splade-v3), never the step's.

Imports: vllm, torch.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.bert import BertSpladeSparseEmbeddingModel, SPLADESparsePooler


class RblnBertSpladeModel(BertSpladeSparseEmbeddingModel):
    def _build_pooler(self, pooler_config):  # type: ignore[no-untyped-def]
        pooler = super()._build_pooler(pooler_config)
        for task_pooler in pooler.poolers_by_task.values():
            if isinstance(task_pooler, SPLADESparsePooler):
                task_pooler.remove_cls_sep = False
        return pooler

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        weights = list(weights)
        names = {name for name, _ in weights}
        weights = [
            (_decoder_bias(name) if "cls.predictions.decoder.bias" not in names else name, tensor)
            for name, tensor in weights
        ]
        loaded: set[str] = super().load_weights(weights)
        if "mlm_head.decoder.weight" not in loaded and getattr(self.model.config, "tie_word_embeddings", True):
            decoder = self.mlm_head.decoder.weight
            # vLLM's vocabulary embedding may pad its rows; the decoder takes the vocabulary's.
            decoder.data.copy_(self.model.embeddings.word_embeddings.weight.data[: decoder.shape[0]])
            loaded.add("mlm_head.decoder.weight")
        return loaded


def _decoder_bias(name: str) -> str:
    if name.endswith("cls.predictions.bias"):
        return name[: -len("bias")] + "decoder.bias"
    return name
