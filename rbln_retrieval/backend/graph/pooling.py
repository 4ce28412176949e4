"""Pooling inside the compiled graph: vLLM's sequence poolers re-expressed on static shapes.

vLLM's poolers index with per-request Python lists; a static graph cannot. Every sequence pooling method is a
weighted sum of the step's token rows, so one ``[max_requests, bucket]`` weight matrix per method (built on the
host, zero on padding columns) turns CLS, last-token and mean pooling into a single matmul whose shape depends
on the bucket only. The head's tensor part (BERT's pooler dense+tanh, ModernBERT's head, classifier or score row, logit
calibration, projector) and its activation (normalize, sigmoid) follow in the graph. Per-request choices (Matryoshka
``dimensions``, ``use_activation=False``) are applied on the host to the pooled rows, as vLLM's heads do.
A pooler that does not decompose (token-level tasks, custom poolers) falls back to vLLM's own on the graph's
hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from vllm.model_executor.layers.pooler import DispatchPooler
from vllm.model_executor.layers.pooler.seqwise.heads import ClassifierPoolerHead, EmbeddingPoolerHead
from vllm.model_executor.layers.pooler.seqwise.methods import CLSPool, LastPool, MeanPool
from vllm.model_executor.layers.pooler.seqwise.poolers import SequencePooler
from vllm.pooling_params import PoolingParams

METHODS: dict[type, str] = {CLSPool: "CLS", LastPool: "LAST", MeanPool: "MEAN"}


def _embedding_part(head: EmbeddingPoolerHead, x: torch.Tensor) -> torch.Tensor:
    if head.head_dtype is not None:
        x = x.to(head.head_dtype)
    return head.projector(x) if head.projector is not None else x


def _classifier_part(head: ClassifierPoolerHead, x: torch.Tensor) -> torch.Tensor:
    if head.head_dtype is not None:
        x = x.to(head.head_dtype)
    if head.classifier is not None:
        x = head.classifier(x)
    if head.logit_mean is not None:
        x = x - head.logit_mean
    if head.logit_sigma is not None:
        x = x / head.logit_sigma
    return x


@dataclass
class TaskHead:
    """One pooling task's pooler, split into its static tensor part and its per-request finish."""

    method: str
    inner: list[EmbeddingPoolerHead]  # nested poolers' heads, innermost first (e.g. BERT's dense+tanh)
    head: EmbeddingPoolerHead | ClassifierPoolerHead

    def in_graph(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = pooled
        for inner in self.inner:
            x = _embedding_part(inner, x)
            # Part of the model (BERT's pooler tanh, ModernBERT's GELU + LayerNorm), which vLLM 0.30 holds as the
            # inner head's activation: applied always, as the model's own forward does.
            if inner.activation is not None:
                x = inner.activation(x)
        x = (
            _embedding_part(self.head, x)
            if isinstance(self.head, EmbeddingPoolerHead)
            else _classifier_part(self.head, x)
        )
        activated = self.head.activation(x) if self.head.activation is not None else x
        return x, activated

    def finish(self, raw: torch.Tensor, activated: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        dimensions = getattr(params, "dimensions", None) if isinstance(self.head, EmbeddingPoolerHead) else None
        if dimensions is None:
            return activated if params.use_activation and self.head.activation is not None else raw
        # Matryoshka: truncate first, then normalize, exactly as vLLM's EmbeddingPoolerHead.
        raw = raw[..., :dimensions]
        return self.head.activation(raw) if params.use_activation and self.head.activation is not None else raw


def decompose(pooler: nn.Module, tasks: list[str]) -> dict[str, TaskHead]:
    """The tasks whose pooler runs in the graph, each with its head; tasks left out use vLLM's pooler."""
    if not isinstance(pooler, DispatchPooler):
        return {}
    heads: dict[str, TaskHead] = {}
    for task in tasks:
        node = pooler.poolers_by_task.get(task)
        chain = []
        while isinstance(node, SequencePooler):
            chain.append(node.head)
            node = node.pooling
        method = METHODS.get(type(node))
        if method is None or not chain:
            continue
        outer, inner = chain[0], chain[:0:-1]
        if not isinstance(outer, (EmbeddingPoolerHead, ClassifierPoolerHead)):
            continue
        if not all(isinstance(h, EmbeddingPoolerHead) for h in inner):
            continue
        heads[task] = TaskHead(method, inner, outer)
    return heads


def pooling_weights(
    methods: list[str], starts: np.ndarray, lengths: np.ndarray, bucket: int, max_requests: int
) -> dict[str, torch.Tensor]:
    """``[max_requests, bucket]`` float32 weights per method over each request's slots (``lengths[i]`` slots from
    ``starts[i]``); rows past the step's requests stay zero."""
    ends = starts + lengths
    rows = np.arange(len(starts))
    weights = {}
    for method in methods:
        w = np.zeros((max_requests, bucket), dtype=np.float32)
        if method == "CLS":
            w[rows, starts] = 1.0
        elif method == "LAST":
            w[rows, ends - 1] = 1.0
        else:
            for r, (s, e) in enumerate(zip(starts, ends)):
                w[r, s:e] = 1.0 / (e - s)
        weights[method] = torch.from_numpy(w)
    return weights
