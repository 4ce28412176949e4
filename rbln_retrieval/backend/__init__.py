"""The bundled vLLM plugin: a platform (entry point group ``vllm.platform_plugins``) and the architectures the
backend adds to vLLM (group ``vllm.general_plugins``), both under the name ``rbln_retrieval``.

vLLM resolves its platform afresh in every process, so activation travels in an environment variable that the
engine sets while it starts vLLM (child processes inherit it); merely installing the package activates nothing,
so the plugin coexists with vLLM's CPU platform and with another vendor's plugin. An engine that runs vLLM inside
the calling process claims that process's platform instead (``claim_platform``). vLLM loads general plugins in
every process it starts (API server, engine core, workers, its model-inspection subprocess), so the bundled
architectures are known wherever a model is built; they are registered by name, and cost no import until vLLM
builds one.

The backend by stage, in the order data flows: ``step`` (what a step is padded to and which prompts it takes),
``attention`` (attention over a packed step), ``graph`` (the compiled forward and pooling), ``npu`` (the RBLN SDK
and the compile cache), ``engine_core`` (the scheduler, worker and runner vLLM's engine-core process runs). At the top
only the plugin's own modules: this package (activation), ``platform`` (the platform vLLM resolves), ``config`` (the
runner's settings) and ``vllm_compat`` (every private vLLM name and the SDK's pinned stack). Each stage's
``__init__`` (each top-level module's docstring) names the stages it may import; no stage imports one that imports
it (tests/backend/test_layout.py).

This package is also the backend's front door: the rest of rbln_retrieval calls only the names below (engine
arguments for a target, activation, the compile-only settings, the device and runtime facts, the few vLLM calls an
in-process engine makes) and never imports a backend module itself (tests/project/test_import_graph.py).

May import: errors, cpu_features
Engine libraries: vllm, torch, transformers
Stages it may import: vllm_compat, platform, graph, config, npu, lifetime
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rbln_retrieval.backend import lifetime, vllm_compat
from rbln_retrieval.backend.config import CONFIG_KEY, cache_root, compile_only, engine_arguments, resolve
from rbln_retrieval.backend.npu import artifacts, rbln_runtime
from rbln_retrieval.backend.npu.rbln_runtime import (
    FORCE_NPU_ENV,
    LEGACY_DEVICES_ENV,
    VISIBLE_DEVICES_ENV,
    forced_npu_name,
    probe,
    require,
    require_compiler,
)
from rbln_retrieval.backend.vllm_compat import (
    SDK_PACKAGES,
    SDK_RELEASE,
    collections_deferred,
    drop_import_error_tracebacks,
    fresh_attention_backend_choice,
    installed,
    sdk_mismatches,
    shutdown_keeping_distributed_groups,
    stack_mismatches,
)
from rbln_retrieval.errors import EngineStartError

__all__ = [
    "FORCE_NPU_ENV",
    "LEGACY_DEVICES_ENV",
    "SDK_PACKAGES",
    "SDK_RELEASE",
    "TARGETS",
    "VISIBLE_DEVICES_ENV",
    "activated",
    "claim_platform",
    "collections_deferred",
    "compile_only",
    "compile_only_settings",
    "drop_import_error_tracebacks",
    "engine_args_for",
    "forced_npu_name",
    "fresh_attention_backend_choice",
    "import_model",
    "installed",
    "pin_platform",
    "probe",
    "require",
    "require_compiler",
    "sdk_mismatches",
    "shutdown_keeping_distributed_groups",
    "stack_mismatches",
]

logger = logging.getLogger(__name__)

ACTIVATE_ENV = "RBLN_RETRIEVAL_BACKEND"
PLUGIN_NAME = "rbln_retrieval"  # both entry points' name in pyproject.toml
TARGETS = ("host", "rbln")
PLATFORM = "rbln_retrieval.backend.platform.BundledPlatform"
# The bundled runner subclasses vLLM's V1 runner; V2 would otherwise be picked wherever Triton has a CPU backend.
_ENGINE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def engine_args_for(
    target: str,
    *,
    model_dir: str | Path,
    model: str,
    max_length: int,
    dtype: str,
    strict_shapes: bool,
    additional_config: Mapping[str, Any] | None,
    max_num_batched_tokens: int | None = None,
    gated_mlp: bool = True,
) -> dict[str, Any]:
    """vLLM engine arguments that run an engine on the bundled runner for ``target`` ("host" or "rbln"), merged
    with the caller's other ``additional_config`` entries. The runner's own settings are the caller's
    ``additional_config["rbln_retrieval"]``; ``model`` names the model in the compile cache's key; ``gated_mlp``
    says whether its MLP has three matrices (the step cost). On the rbln target, a compile cache built for another
    NPU, SDK or snapshot is refused here, before vLLM starts."""
    additional = dict(additional_config or {})
    settings = dict(additional.pop(CONFIG_KEY, None) or {})
    if max_num_batched_tokens is not None:
        settings["max_num_batched_tokens"] = max_num_batched_tokens
    npu = settings.pop("npu", None)
    rbln = target == "rbln"
    if rbln:
        rbln_runtime.visible_devices()  # folds a legacy RBLN_DEVICES in before vLLM's processes start
        npu = npu or rbln_runtime.npu_name()
    bundled = resolve(
        target=target,
        max_length=max_length,
        model=model,
        dtype=dtype,
        strict_shapes=strict_shapes,
        user=settings,
        gated_mlp=gated_mlp,
        npu=npu,
        sdk=rbln_runtime.sdk_version() if rbln else "",
        snapshot=artifacts.snapshot_fingerprint(model_dir, cache_root() / artifacts.CONTENT_HASHES) if rbln else "",
    )
    if rbln:  # the compile command replaces a mismatched cache instead
        pins = artifacts.pins_for(bundled)
        artifacts.check(bundled.cache_dir(), pins, model=model, rebuild=bundled.compile_only)
    arguments = engine_arguments(bundled)
    arguments["additional_config"] = {**additional, **arguments["additional_config"]}
    return arguments


def compile_only_settings(npu: str) -> dict[str, Any]:
    """Engine arguments (``engine_kwargs``) that compile and cache every graph for ``npu`` without running them."""
    return {"additional_config": {CONFIG_KEY: {"compile_only": True, "npu": npu}}}


def register() -> str | None:
    """vLLM calls this in every process; the plugin activates only when an engine asks for it."""
    target = os.environ.get(ACTIVATE_ENV)
    if not target:
        return None
    if target not in TARGETS:
        logger.warning("%s=%r is not one of %s; the bundled backend stays off.", ACTIVATE_ENV, target, TARGETS)
        return None
    return PLATFORM


def register_general() -> None:
    """vLLM calls this in every process its plugin scope lets it (a stock engine's too): registers the bundled
    architectures and, in a process started for one of this package's engines, watches the process that started
    it (``lifetime``)."""
    lifetime.watch_starter()
    register_models()


def register_models() -> None:
    """The architectures the bundled backend adds, each by "module:class", so that a process imports a model's
    module only to build it."""
    from vllm import ModelRegistry

    from rbln_retrieval.backend.graph import ARCHITECTURES

    for architecture, model_class in ARCHITECTURES.items():
        if architecture not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(architecture, model_class)


def import_model(architecture: str) -> None:
    """Register ``architecture`` (one of the bundled ones) as its class, imported here, for a process that starts an
    engine of it: vLLM inspects a class registered by name in a subprocess that imports vLLM and the model anew (tens
    of seconds, once per version of the module), and the engine's processes forked from this one inherit it."""
    from vllm import ModelRegistry

    from rbln_retrieval.backend.graph import ARCHITECTURES

    module, name = ARCHITECTURES[architecture].split(":")
    ModelRegistry.register_model(architecture, getattr(importlib.import_module(module), name))


def claim_platform() -> bool:
    """Make vLLM's platform in this process the bundled one, so that engines running inside this process can use
    the bundled runner; False when another vendor's platform is active.

    vLLM resolves its platform once per process, on the first import of almost anything from vLLM, and its modules
    keep that object. If it already chose vLLM's CPU platform, the object becomes a ``BundledPlatform`` in place:
    the subclass holds no state and is exactly the CPU platform for engines without bundled settings.
    """
    platform = _resolved_platform("host")
    from vllm.platforms.cpu import CpuPlatform

    from rbln_retrieval.backend.platform import BundledPlatform

    if type(platform) is CpuPlatform:
        platform.__class__ = BundledPlatform
    return isinstance(platform, BundledPlatform)


def pin_platform(target: str | None) -> None:
    """Resolve vLLM's platform in this process under ``target``'s plugin scope (the bundled platform, or vLLM's
    CPU platform for None) before anything else in the process imports vLLM; refuse in one sentence when another
    vendor's platform (vllm-rbln's, on an NPU host) was resolved first.

    A process that serves vLLM's app (``rbln-retrieval serve``, a Ray Serve replica) runs vLLM's frontend under the
    platform it resolves once, on its first vLLM import: this makes that the bundled one, whatever plugins are
    installed or named in ``VLLM_PLUGINS``.
    """
    platform = _resolved_platform(target)
    from vllm.platforms.cpu import CpuPlatform

    if not isinstance(platform, CpuPlatform):  # BundledPlatform is a CpuPlatform
        kind = type(platform)
        raise EngineStartError(
            f"vLLM's platform in this process is already {kind.__module__}.{kind.__qualname__} (vLLM was imported "
            "before rbln-retrieval chose its backend), so this process cannot run rbln-retrieval's backend; start "
            "it in a fresh process, or import rbln_retrieval's entry point before anything imports vLLM."
        )


def _resolved_platform(target: str | None) -> object:
    """vLLM's platform object of this process, resolved under ``target``'s plugin scope if not resolved yet, with
    vLLM's general plugins loaded under the same scope: vLLM does each once per process, and an NPU host's
    vllm-rbln registers a platform and general plugins that need rebel-compiler."""
    with activated(target):
        from vllm import platforms
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        return platforms.current_platform


@contextmanager
def activated(target: str | None, env: dict[str, str] | None = None) -> Iterator[None]:
    """Environment for vLLM processes started inside the block: the platform on ``target``, or off for None, this
    process's pid (the processes it starts end with it: ``lifetime``), plus ``env``.

    vLLM refuses to start when two out-of-tree platform plugins activate (the official vllm-rbln plugin installed
    beside this package would be the second), so every engine loads our plugin alone: a stock engine with the
    platform off and the bundled architectures registered (a checkpoint whose family's spec names one runs as it).
    """
    if target is not None and target not in TARGETS:
        raise ValueError(f"target={target!r} is not one of {TARGETS}.")
    vllm_compat.check_stack()
    wanted = {
        ACTIVATE_ENV: target,
        "VLLM_PLUGINS": PLUGIN_NAME,
        **lifetime.starter_env(),
        **(_ENGINE_ENV if target else {}),
        **(env or {}),
    }
    saved = {name: os.environ.get(name) for name in wanted}
    try:
        for name, value in wanted.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
