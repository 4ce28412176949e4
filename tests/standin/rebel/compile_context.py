"""Stand-in for rebel's compile context: graphs compiled with one context share one copy of the weights."""

from __future__ import annotations


class CompileContext:
    def __init__(self, use_weight_sharing: bool = False, use_global_ctx: bool = False) -> None:
        self.use_weight_sharing = use_weight_sharing
        self.use_global_ctx = use_global_ctx
