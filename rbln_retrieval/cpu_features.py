"""The host CPU's class, as every CPU-dependent choice of this package reads it.

Two classes matter: CPUs that multiply bfloat16 natively (AVX512_BF16 or AMX; AMX, the Xeons' matrix tiles, also
picks the host layers' fused GEMMs) and those that do not (AVX2-only
x86 such as AMD EPYC Zen 2/3, where bf16 is emulated several times slower than float32). The flags come from
``/proc/cpuinfo``, capped by ATen's own override ``ATEN_CPU_CAPABILITY`` ("avx2" or "default" rules AVX-512 out),
so that one variable makes this package choose dtype and vLLM kernels as the smaller class would (see README,
"Testing as the other CPU class").

May import: nothing
Engine libraries: none
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# ATen capability names below AVX-512: with one of these, AVX-512 code paths are treated as absent.
_BELOW_AVX512 = ("default", "avx2")


def hardware_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def capped_to_avx2() -> bool:
    """Whether ATEN_CPU_CAPABILITY asks for the AVX2 (or scalar) class on this process."""
    return os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in _BELOW_AVX512


def flags() -> set[str]:
    """Hardware flags as this process may use them: AVX-512 ones dropped under an AVX2 capability cap."""
    found = hardware_flags()
    if capped_to_avx2():
        found = {flag for flag in found if not flag.startswith(("avx512", "amx"))}
    return found


def avx512() -> bool:
    """Whether vLLM's AVX-512 kernel builds apply (vLLM loads its AVX2 build otherwise)."""
    return "avx512f" in flags()


def native_bf16() -> bool:
    return any(flag in flags() for flag in BF16_FLAGS)


def amx() -> bool:
    """Whether bfloat16 GEMMs run on AMX tiles (Intel Xeon from Sapphire Rapids), not AVX512_BF16 dot products."""
    return "amx_bf16" in flags()


def cpu_class() -> str:
    """The class this process computes as, for reports: "AMX", "AVX512_BF16", "AVX-512" or "AVX2"."""
    if amx():
        return "AMX"
    if native_bf16():
        return "AVX512_BF16"
    return "AVX-512" if avx512() else "AVX2"


@functools.cache
def warn_emulated_bf16() -> None:
    """Once per process: bfloat16 asked for on a CPU that emulates it."""
    logger.warning(
        "dtype='bfloat16' on a CPU without AVX512_BF16 or AMX runs correctly but emulated, several times slower "
        "than float32; dtype='auto' picks float32 on this CPU."
    )
