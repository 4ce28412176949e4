"""Keep library start-up chatter that a retrieval user cannot act on out of their output.

May import: nothing
Engine libraries: none
"""

from __future__ import annotations

import logging
import os
import warnings


def quiet_vllm() -> None:
    """vLLM logs every start-up detail at INFO; users of a library want its errors only unless they ask."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def quiet_startup() -> None:
    """For programs (the CLI, the examples): quiet vLLM, transformers and torch in this process and in the engine
    processes it starts, which inherit the environment.

    vLLM warns about the CPU build (no Triton) while it is imported, before its logging is configured, which
    Python's last-resort handler would print; its own configuration later replaces our errors-only handler.
    """
    quiet_vllm()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's NUMA-binding notice in the engine process
    # FutureWarnings from torch inside vLLM, and the shared-memory note vLLM's engine leaves at exit.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore:resource_tracker:UserWarning")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|vllm|transformers)\.")
    vllm_logger = logging.getLogger("vllm")
    if not any(getattr(handler, "_rbln_quiet", False) for handler in vllm_logger.handlers):
        handler = logging.StreamHandler()
        handler.setLevel(logging.ERROR)
        handler._rbln_quiet = True  # type: ignore[attr-defined]
        vllm_logger.addHandler(handler)
