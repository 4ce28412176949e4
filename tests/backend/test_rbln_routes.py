"""Both RBLN compile routes on a small module, without an engine: each route calls the stand-in compiler
(tests/standin) the way SDK 0.12 is called and computes what eager torch computes; every checker of the stand-in
refuses what it must refuse (a broken graph contract, a retired or missing option, an input description that is not
the module's), so the engine-level tests on both routes fail when any of these breaks."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from rbln_retrieval.backend.graph.compile import RecordingBackend
from rbln_retrieval.backend.npu import rbln_runtime
from rbln_retrieval.errors import DeviceUnavailableError

NPU_OF_ROUTE = {"aot": "RBLN-CA25", "torch.compile": "RBLN-CR13"}
WIDTH = 64  # the compiler's alignment of a last dimension


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.linear(x)) * scale)


class WritesItsInput(Block):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return super().forward(x, scale)


class StridedWeight(Block):
    def __init__(self) -> None:
        super().__init__()
        self.extra = torch.nn.Parameter(torch.randn(WIDTH, WIDTH).t(), requires_grad=False)  # a transposed view

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return super().forward(x @ self.extra, scale)


@torch.library.custom_op("standin_test::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsAHostKernel(Block):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.ops.standin_test.double(x), scale)


# The compiler's documented limits (vllm-rbln, optimum-rbln, the SDK's op table), one module breaking each.
class GathersWithInt64(Block):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return super().forward(x[torch.arange(x.shape[0])], scale)


class InvertsABoolMask(Block):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.where(~(x > 0), x, 0.0), scale)


class ReducesToAScalar(Block):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return super().forward(x / x.abs().sum(), scale)


class SlicesNothing(Block):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cat([x, x[:, WIDTH:]], dim=-1), scale)


def _inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, WIDTH), torch.full((WIDTH,), 0.5)


def _compile(route: str, module: torch.nn.Module, cache_dir: Path, *, weights_as_state: bool = True, **changes):
    """``module`` through the route's backend as the bundled runner calls it; ``changes`` alter the options (None
    removes one) or torch.compile's ``fullgraph``."""
    chosen = rbln_runtime.rbln_compile_backend(
        cache_dir, npu=NPU_OF_ROUTE[route], dtype="float32", compile_only=False, process_groups={"tp": [0]}
    )
    fullgraph = changes.pop("fullgraph", chosen.fullgraph)
    options = None if chosen.options is None else dict(chosen.options)
    for name, value in changes.items():
        options.pop(name) if value is None else options.__setitem__(name, value)
    recorder = RecordingBackend(chosen.backend, weights_as_state=weights_as_state)
    return torch.compile(module, backend=recorder, options=options, dynamic=False, fullgraph=fullgraph), chosen


@pytest.mark.parametrize("route", ["aot", "torch.compile"])
def test_each_route_compiles_a_graph_per_shape_that_computes_what_eager_computes(route, standin_rebel, tmp_path):
    from rebel import aot

    module = Block().eval()
    rbln_runtime.contiguous_weights(module)
    compiled, chosen = _compile(route, module, tmp_path)
    first, runtimes = len(standin_rebel.COMPILED), len(aot.RUNTIMES)
    for rows in (4, 16):
        inputs = _inputs(rows)
        torch.testing.assert_close(compiled(*inputs), module(*inputs))
    graphs = standin_rebel.COMPILED[first:]
    assert [g.route for g in graphs] == [route, route] and all(not g.violations and g.ops for g in graphs)
    assert graphs[0].weight_storages == graphs[1].weight_storages, "one copy of the weights for both graphs"
    if route == "aot":
        assert graphs[0].options["compile_context"] is graphs[1].options["compile_context"]
        assert graphs[0].options["compile_context"].use_weight_sharing and graphs[0].options["num_devices"] == 1
        assert (chosen.backend.compiled, chosen.backend.loaded) == (2, 0) and len(aot.RUNTIMES) == runtimes + 2
        assert len(list((tmp_path / "rbln").glob("graph-*.rbln"))) == 2
    else:
        assert graphs[0].options["mode"] == ["strict"] and graphs[0].options["num_devices"] == 1


def test_atom_artifacts_are_loaded_not_compiled_by_the_next_start(standin_rebel, tmp_path):
    module = Block().eval()
    built, _ = _compile("aot", module, tmp_path)
    built(*_inputs(4))
    torch._dynamo.reset()  # a new process: nothing captured yet
    first = len(standin_rebel.COMPILED)
    again, chosen = _compile("aot", module, tmp_path)
    inputs = _inputs(4)
    torch.testing.assert_close(again(*inputs), module(*inputs))
    assert (chosen.backend.compiled, chosen.backend.loaded) == (0, 1)
    assert standin_rebel.COMPILED[first:] == [], "a loaded artifact is not compiled again"


@pytest.mark.parametrize("route", ["aot", "torch.compile"])
@pytest.mark.parametrize(
    ("module", "violation"),
    [
        (WritesItsInput, "write into graph input"),
        (StridedWeight, "non-contiguous weight"),
        (CallsAHostKernel, "op outside ATen: standin_test.double"),
        (GathersWithInt64, "has dtype torch.int64"),
        (InvertsABoolMask, r"inverts a bool mask \(aten.bitwise_not.default\)"),
        (ReducesToAScalar, "reduces to a 0-d tensor"),
        (SlicesNothing, r"is a zero-size tensor \(4, 0\)"),
    ],
)
def test_each_route_refuses_a_graph_that_breaks_the_contract(route, module, violation, standin_rebel, tmp_path):
    compiled, _ = _compile(route, module().eval(), tmp_path)
    with pytest.raises(Exception, match=violation):
        compiled(*_inputs(4))


@pytest.mark.parametrize("route", ["aot", "torch.compile"])
def test_each_route_refuses_an_input_whose_last_dimension_is_not_64_aligned(route, standin_rebel, tmp_path):
    compiled, _ = _compile(route, Block().eval(), tmp_path)
    with pytest.raises(Exception, match="input l_scale_ has last dimension 1, not a multiple of 64"):
        compiled(torch.randn(4, WIDTH), torch.tensor([0.5]))


@pytest.mark.parametrize("route", ["aot", "torch.compile"])
def test_each_route_refuses_weights_passed_as_graph_inputs(route, standin_rebel, tmp_path):
    compiled, _ = _compile(route, Block().eval(), tmp_path, weights_as_state=False)
    with pytest.raises(Exception, match="weight passed as graph input"):
        compiled(*_inputs(4))


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"tensor_parallel_size": 1}, "option 'tensor_parallel_size' is retired; SDK 0.12 takes 'num_devices'"),
        ({"num_devices": None}, "option 'num_devices' missing"),
        ({"process_group_dict": None}, "option 'process_group_dict' missing"),
        ({"use_static_output": None}, "option 'use_static_output' missing"),
        ({"dtype": None}, "option 'dtype' missing"),
        ({"mode": "strict"}, "mode must be a list"),
        ({"model_trace_method": "jit"}, "model_trace_method 'jit' is not 'export'"),
        ({"fullgraph": False}, "without fullgraph=True"),
    ],
)
def test_the_torch_compile_standin_refuses_options_sdk_012_does_not_take(changes, refusal, standin_rebel, tmp_path):
    compiled, _ = _compile("torch.compile", Block().eval(), tmp_path, **changes)
    with pytest.raises(Exception, match=refusal):
        compiled(*_inputs(4))


def test_compile_from_torch_checks_input_info_against_the_module(standin_rebel):
    import rebel
    from rebel.aot import InputInfoError

    module = Block().eval()
    x, scale = _inputs(4)
    good = [("x", [4, WIDTH], "float32"), ("scale", [WIDTH], "float32")]
    model = rebel.compile_from_torch(module, input_info=good, npu="RBLN-CA25", example_inputs=[x, scale])
    runtime = model.create_runtime(device=0, tensor_type="pt")
    torch.testing.assert_close(runtime(x, scale), module(x, scale))
    wrong = {
        "names": ([("input", [4, WIDTH], "float32"), ("scale", [WIDTH], "float32")], "are not the module's inputs"),
        "shape": ([("x", [2, WIDTH], "float32"), ("scale", [WIDTH], "float32")], "but the example is"),
        "dtype": ([("x", [4, WIDTH], "int64"), ("scale", [WIDTH], "float32")], "but the example is"),
    }
    for info, refusal in wrong.values():
        with pytest.raises(InputInfoError, match=refusal):
            rebel.compile_from_torch(module, input_info=info, npu="RBLN-CA25", example_inputs=[x, scale])
    with pytest.raises(TypeError, match="tensor_parallel_size"):
        rebel.compile_from_torch(module, input_info=good, npu="RBLN-CA25", tensor_parallel_size=1)
    with pytest.raises(InputInfoError, match="compiled for"):
        runtime(torch.randn(2, WIDTH), scale)


def test_sdk_012_environment_names_and_the_legacy_ones_with_one_warning(standin_rebel, monkeypatch, capsys):
    from rbln_retrieval.ray.resources import announce_placement

    monkeypatch.setattr(rbln_runtime, "_warned", set())
    for name in ("RBLN_VISIBLE_DEVICES", "RBLN_DEVICES", "RBLN_FORCE_NPU_NAME", "RBLN_TARGET_SOC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REBEL_STANDIN_NPU", "RBLN-CA22")
    assert rbln_runtime.visible_devices() == [] and rbln_runtime.npu_name() == "RBLN-CA22", "the mounted NPU"
    # Ray's RBLN resource sets the legacy name per actor: read as RBLN_VISIBLE_DEVICES, warned about once.
    monkeypatch.setenv("RBLN_DEVICES", "2")
    announce_placement("embedding actor")
    assert capsys.readouterr().out == "rbln-retrieval embedding actor: RBLN_DEVICES=2\n"
    with pytest.warns(DeprecationWarning, match="RBLN_DEVICES is deprecated .* uses RBLN_VISIBLE_DEVICES=2"):
        assert rbln_runtime.visible_devices() == ["2"]
    assert os.environ["RBLN_VISIBLE_DEVICES"] == "2" and "RBLN_DEVICES" not in os.environ
    monkeypatch.setenv("RBLN_DEVICES", "3")  # SDK 0.12's name wins once set
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rbln_runtime.visible_devices() == ["2"], "one warning per process"
    announce_placement("embedding actor")
    assert capsys.readouterr().out == "rbln-retrieval embedding actor: RBLN_VISIBLE_DEVICES=2\n"
    monkeypatch.setenv("RBLN_TARGET_SOC", "RBLN-CR13")
    with pytest.warns(DeprecationWarning, match="RBLN_TARGET_SOC is deprecated"):
        assert rbln_runtime.npu_name() == "RBLN-CR13"
    monkeypatch.setenv("RBLN_FORCE_NPU_NAME", "RBLN-CA25")
    assert rbln_runtime.npu_name() == "RBLN-CA25"
    assert [rbln_runtime.family_of(n).name for n in ("RBLN-CA25", "RBLN-CR13")] == ["ATOM", "Rebel100"]
    with pytest.raises(DeviceUnavailableError, match="'RBLN-XX1' is of no family"):
        rbln_runtime.family_of("RBLN-XX1")
