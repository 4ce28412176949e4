"""vLLM's CPU worker with the bundled runner in place of its model runner."""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from rbln_retrieval.backend.engine_core.model_runner import BundledModelRunner
from rbln_retrieval.backend.engine_core.warmup import warm_up


class BundledWorker(CPUWorker):
    def init_device(self) -> None:
        if self.use_v2_model_runner:
            raise RuntimeError(
                "The bundled runner extends vLLM's V1 model runner; unset VLLM_USE_V2_MODEL_RUNNER (the engine sets 0)."
            )
        super().init_device()
        # CPUWorker builds vLLM's runner here; the bundled one replaces it before the model loads.
        self.model_runner = BundledModelRunner(self.vllm_config, torch.device("cpu"))

    def compile_or_warm_up_model(self) -> Any:
        times = super().compile_or_warm_up_model()
        self.warmup_seconds = warm_up(self.model_runner)
        return times

    def bundled_stats(self) -> dict[str, Any]:
        """Served through AsyncLLM.collective_rpc by PoolingEngine.stats()."""
        return {**self.model_runner.stats(), "warmup_seconds": getattr(self, "warmup_seconds", {})}
