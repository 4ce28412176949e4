"""Attention over a packed, padded, context-free pooling step: the attention backend vLLM's layers call
(``backend``), the static kernels' masked attention traced into the graph (``masked``) and the host kernels'
attention outside it (``host``: vLLM's CPU kernel over the step, else torch's fused attention per prompt).

Stages it may import: config, vllm_compat
"""
