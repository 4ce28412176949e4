"""vLLM's CPU platform plus the bundled runner, for engines that ask for it in ``additional_config``.

The plugin loads in every vLLM process of an engine started with the activation variable set, but an engine
whose config does not carry the bundled settings (``runner="stock"``) gets exactly vLLM's CPU platform.

Stages it may import: config, graph, vllm_compat
"""

from __future__ import annotations

from typing import Any

from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import CpuArchEnum

from rbln_retrieval.backend import vllm_compat
from rbln_retrieval.backend.config import BundledConfig

WORKER = "rbln_retrieval.backend.engine_core.worker.BundledWorker"
ATTENTION = "rbln_retrieval.backend.attention.backend.PackedAttentionBackend"


class BundledPlatform(CpuPlatform):
    """Keeps the CPU enum (vLLM asks ``is_cpu()`` in many places); tensors stay on the host for both targets."""

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        bundled = BundledConfig.requested(vllm_config)
        if bundled and vllm_config.parallel_config.worker_cls == "auto":
            vllm_config.parallel_config.worker_cls = WORKER
        asked = vllm_config.parallel_config.distributed_executor_backend
        super().check_and_update_config(vllm_config)
        # vLLM's CPU platform turns "uni" into "mp" whenever the engine core is a process of its own, because only
        # a worker process it spawns gets its thread binding; an engine that asks for "uni" leaves the binding to
        # the OS and keeps its worker in the engine core.
        if bundled and asked == "uni":
            vllm_config.parallel_config.distributed_executor_backend = "uni"

    @classmethod
    def import_kernels(cls) -> None:
        """vLLM picks its kernel build (AVX-512 BF16, AVX-512, AVX2) from the hardware alone; under ATen's AVX2
        capability cap this process loads the AVX2 build, so the whole process computes as that CPU class."""
        from rbln_retrieval import cpu_features

        if cpu_features.capped_to_avx2() and cls.get_cpu_architecture() == CpuArchEnum.X86:
            vllm_compat.load_avx2_kernels()
        else:
            super().import_kernels()

    @classmethod
    def import_ir_kernels(cls) -> None:
        super().import_ir_kernels()
        import rbln_retrieval.backend.graph.host_kernels  # noqa: F401  (registers the CPU RMSNorm implementations)

    @classmethod
    def get_default_ir_op_priority(cls, vllm_config: Any) -> Any:
        """vLLM's C RMSNorm kernels first for host kernels; the NPU's graphs keep the torch implementation."""
        priority = super().get_default_ir_op_priority(vllm_config)
        if BundledConfig.requested(vllm_config) and BundledConfig.from_vllm_config(vllm_config).kernels == "host":
            from rbln_retrieval.backend.graph.host_kernels import PROVIDER

            priority.rms_norm = [PROVIDER, *priority.rms_norm]
            priority.fused_add_rms_norm = [PROVIDER, *priority.fused_add_rms_norm]
        return priority

    @classmethod
    def opaque_attention_op(cls) -> bool:
        """Static kernels put attention inside the compiled graph (an NPU graph must contain it); host kernels keep
        it behind vLLM's opaque attention op, which calls the host attention outside the graph."""
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config()
        if BundledConfig.requested(config):
            return BundledConfig.from_vllm_config(config).kernels == "host"
        return super().opaque_attention_op()

    @classmethod
    def get_attn_backend_cls(
        cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        from vllm.config import get_current_vllm_config  # vllm.config imports the platform while loading

        if BundledConfig.requested(get_current_vllm_config()):
            if attn_selector_config.use_mla or attn_selector_config.use_sparse:
                raise NotImplementedError("The bundled pooling runner does not support MLA or sparse attention.")
            return ATTENTION
        return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
