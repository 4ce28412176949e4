"""The bundled runner against vLLM's stock runner and plain transformers, then a mixed workload under
strict_shapes: every graph at a declared bucket, nothing compiled after warmup, no graph breaks."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import reference
from corpus import mixed_length, passages
from model_builders import BUILDERS

FAMILIES = [*BUILDERS, "all-MiniLM-L6-v2"]
TEXTS = mixed_length(40)  # one word to thousands (truncated at max_length)
QUERY = "How are exceptions raised and handled in Python?"
TOLERANCE = 1e-5


def _outputs(engine):
    """What the family serves: document and query vectors for embedders, scores for every family."""
    family = engine.family
    if family.is_cross_encoder:
        return {"scores": np.array(engine.score(QUERY, TEXTS))}
    if family.name == "splade":  # one vocabulary-sized row per text from vLLM's pooler, scored by dot product
        return {
            "sparse": engine.embed(TEXTS, output="sparse"),
            "query_sparse": engine.embed([QUERY, TEXTS[3]], kind="query", output="sparse"),
            "scores": np.array(engine.score(QUERY, TEXTS[:9])),
        }
    if family.late_interaction_only:  # ColBERT: token vectors pooled by vLLM's pooler, scores by MaxSim
        return {
            "multi_vector": engine.embed(TEXTS, output="multi_vector"),
            "query_multi_vector": engine.embed([QUERY, TEXTS[3]], kind="query", output="multi_vector"),
            "scores": np.array(engine.score(QUERY, TEXTS[:9])),
        }
    outputs = {
        "documents": engine.embed(TEXTS),
        "queries": engine.embed([QUERY, TEXTS[3]], kind="query"),
        "scores": np.array(engine.score(QUERY, TEXTS[:9])),
    }
    if family.output.matryoshka_dimensions:  # truncated after the graph's projection, normalized after truncation
        outputs["smallest"] = engine.embed(TEXTS, dimensions=family.output.matryoshka_dimensions[-1])
    if family.name == "bge-m3":  # token-level outputs: pooled by vLLM's pooler from the bundled graph's rows
        outputs["sparse"] = engine.embed(TEXTS, output="sparse")
        outputs["multi_vector"] = engine.embed(TEXTS, output="multi_vector")
    return outputs


def _max_difference(a, b) -> float:
    """Largest absolute difference: of arrays, of per-text multi-vector arrays, or of per-text sparse weights
    (a token missing on one side counts as weight 0, so only a weight within rounding of zero may differ)."""
    if isinstance(a, np.ndarray):
        return float(np.abs(a - b).max())
    assert len(a) == len(b)
    if isinstance(a[0], np.ndarray):
        return max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    return max(abs(x.get(t, 0.0) - y.get(t, 0.0)) for x, y in zip(a, b) for t in set(x) | set(y))


# Computed once per model and session: the stock runner's outputs (a family's route tests and its bundled test
# compare against the same ones) and the plain-transformers reference.
_STOCK: dict[str, dict] = {}
_REFERENCE: dict[str, dict] = {}


def _stock_outputs(path, stock) -> dict:
    if str(path) not in _STOCK:
        _STOCK[str(path)] = _outputs(stock)
    return _STOCK[str(path)]


def _reference(path, family) -> dict:
    if str(path) not in _REFERENCE:
        _REFERENCE[str(path)] = _transformers_reference(path, family)
    return _REFERENCE[str(path)]


def _transformers_reference(path, family):
    length = family.tokens.max_length
    if family.name == "cross-encoder":
        return {"scores": np.array(reference.cross_encoder_scores(str(path), QUERY, TEXTS, max_length=length))}
    if family.name == "qwen3-reranker":
        return {
            "scores": np.array(
                reference.qwen3_reranker_scores(
                    str(path), QUERY, TEXTS, instruction=family.prompt.default_instruction, max_length=length
                )
            )
        }
    if family.name == "colbert":
        documents = reference.colbert(str(path), TEXTS, max_length=length)
        queries = reference.colbert(str(path), [QUERY, TEXTS[3]], max_length=length)
        scores = np.array([reference.colbert_maxsim(queries[0], d) for d in documents[:9]])
        return {"multi_vector": documents, "query_multi_vector": queries, "scores": scores}
    if family.name == "splade":
        documents = reference.splade(str(path), TEXTS, max_length=length)
        queries = reference.splade(str(path), [QUERY, TEXTS[3]], max_length=length)
        scores = np.array([sum(w * d.get(t, 0.0) for t, w in queries[0].items()) for d in documents[:9]])
        return {"sparse": documents, "query_sparse": queries, "scores": scores}
    if family.name == "embeddinggemma":
        embed = functools.partial(reference.embeddinggemma, str(path), max_length=length)
    else:
        kw = dict(pooling=family.pool.pooling, max_length=length, normalize=family.output.normalize)
        embed = functools.partial(reference.embed, str(path), **kw)
    documents = embed(TEXTS, prefix=family.prompt.document_prompt)
    queries = embed([QUERY, TEXTS[3]], prefix=family.prompt.query_prompt)
    expected = {"documents": documents, "queries": queries, "scores": documents[:9] @ queries[0]}
    if family.output.matryoshka_dimensions:
        expected["smallest"] = embed(
            TEXTS, prefix=family.prompt.document_prompt, dimensions=family.output.matryoshka_dimensions[-1]
        )
    if family.name == "bge-m3":
        _, expected["sparse"], expected["multi_vector"] = reference.bge_m3(str(path), TEXTS, max_length=length)
    return expected


@pytest.mark.parametrize("pair", FAMILIES, indirect=True)
def test_bundled_equals_stock_equals_reference(pair):
    path, bundled, stock = pair
    ours, theirs, expected = _outputs(bundled), _stock_outputs(path, stock), _reference(path, bundled.family)
    for key in expected:
        assert _max_difference(ours[key], theirs[key]) <= TOLERANCE, f"{key}: bundled vs stock"
        assert _max_difference(ours[key], expected[key]) <= TOLERANCE, f"{key}: bundled vs transformers"
    stats = bundled.stats()
    assert stats["runner"] == "bundled" and stats["steps"] > 0
    assert stats["useful_tokens"] < stats["computed_tokens"] <= stats["steps"] * stats["buckets"][-1]
    family = bundled.family.name
    # ColBERT has token-level output only: no sequence pooler to move into the graph; SPLADE's pooler is vLLM's own.
    in_graph = {"cross-encoder": ["classify"], "qwen3-reranker": ["classify"], "colbert": [], "splade": []}
    assert stats["pooling_in_graph"] == in_graph.get(family, ["embed"])
    # Host kernels write BERT and ModernBERT blocks' activations and residual adds in place; Qwen3, Gemma3 and the
    # rope encoders (vLLM's bert_with_rope) have none.
    assert (stats["in_place_blocks"] > 0) == (
        not family.startswith("qwen3") and family not in ("gte-new", "nomic", "embeddinggemma")
    )
    assert stock.stats() == {"runner": "stock", "model": {"path": str(Path(path).resolve())}}
    assert stats["model"] == stock.stats()["model"]


NPU_NAMESPACES = {"aten", "prims", "rbln_custom_ops"}
# Every family on the torch.compile route (RBLN-CR13); on the ahead-of-time route (RBLN-CA25), whose graphs are the
# same bucket graphs handed to another entry point, one family of each kind: an encoder, a cross-encoder, a causal
# model and bge-m3 (token-level outputs pooled on the host).
# One test per route, each parametrized by ``pair`` alone, so pytest groups every test of a family around one pair.
AOT_FAMILIES = ["all-MiniLM-L6-v2", "bert-cross-encoder", "qwen3-embedding", "bge-m3"]


@pytest.mark.parametrize("pair", FAMILIES, indirect=True)
def test_rbln_target_on_the_torch_compile_route(pair, request, caplog):
    assert_rbln_target(pair, "RBLN-CR13", request, caplog)


@pytest.mark.parametrize("pair", AOT_FAMILIES, indirect=True)
def test_rbln_target_on_the_ahead_of_time_route(pair, request, caplog):
    assert_rbln_target(pair, "RBLN-CA25", request, caplog)


def assert_rbln_target(pair, npu, request, caplog):
    """device="rbln" against the stand-in compiler, on the route of each NPU family: each bucket graph lowers to
    ATen only, writes into none of its inputs, holds real contiguous weights as module state (one copy shared by
    every bucket), is compiled the way SDK 0.12 compiles for that family, and computes what vLLM's stock runner
    computes. A family with token-level outputs says at start where they are pooled."""
    path, _, stock = pair
    engine, compiled = request.getfixturevalue({"RBLN-CA25": "rbln_atom", "RBLN-CR13": "rbln_rebel100"}[npu])
    at_start = [r.getMessage() for r in caplog.get_records("setup") + caplog.get_records("call")]
    ours, theirs = _outputs(engine), _stock_outputs(path, stock)
    notes = [m for m in at_start if "pooled by vLLM's pooler on the host" in m]
    assert len(notes) == (engine.family.name in ("bge-m3", "colbert", "splade")), notes
    for key in theirs:
        assert _max_difference(ours[key], theirs[key]) <= TOLERANCE, f"{key}: rbln target vs stock"
    stats = engine.stats()
    route = {"RBLN-CA25": "aot", "RBLN-CR13": "torch.compile"}[npu]
    assert (stats["target"], stats["kernels"], stats["npu"], stats["route"]) == ("rbln", "static", npu, route)
    assert stats["compiles"] == len(stats["buckets"]) == len(compiled), "one graph per bucket"
    assert stats["compiles_after_warmup"] == 0 and stats["graph_breaks"] == 0
    assert sorted(g["bucket"] for g in stats["graphs"]) == sorted(stats["buckets"])
    assert all(g["lifted_weights"] == 0 for g in stats["graphs"])
    for graph in compiled:
        assert graph.route == route and not graph.cached
        assert graph.violations == [] and {op.split(".")[0] for op in graph.ops} <= NPU_NAMESPACES
        assert graph.weights > 0 and graph.weight_storages == compiled[0].weight_storages
        assert graph.options["num_devices"] == 1 and "tensor_parallel_size" not in graph.options
    if route == "aot":
        context = compiled[0].options["compile_context"]
        assert context.use_weight_sharing, "one copy of the weights for every bucket graph"
        assert all(g.options["compile_context"] is context and g.options["npu"] == npu for g in compiled)
        assert stats["compile_cache"]["artifacts_compiled"] == len(stats["buckets"])
        return
    for graph in compiled:
        options = graph.options
        assert options["mode"] == ["strict"] and options["model_trace_method"] == "export"
        assert options["use_static_output"] is True and options["dtype"] == "float32"
        assert options["cache_dir"] == str(Path(stats["compile_cache"]["dir"]) / "rbln") and options["mega_cache_only"]
        assert "guard_filter_fn" not in options, "torch.compile keeps the guard filter for itself"
        assert "compile_context" not in options, "device-tensor mode: weights are device tensors, no context"


@pytest.mark.parametrize("pair", ["all-MiniLM-L6-v2"], indirect=True)
def test_steps_are_packed_past_a_prompt_that_does_not_fit(pair):
    """Eight 250-token prompts, then two of 20, into 1,024-token steps: first come, first served stops each step
    at 1,000 tokens and needs a third step; packing moves a 20-token prompt into each of the first two."""
    _, bundled, _ = pair
    long, short = " ".join(["hello"] * 248), " ".join(["hi"] * 18)  # plus [CLS] and [SEP]
    before = bundled.stats()
    vectors = bundled.embed([long] * 8 + [short] * 2)
    after = bundled.stats()
    assert np.allclose(vectors[:8], vectors[0], atol=1e-6) and np.allclose(vectors[8:], vectors[8], atol=1e-6)
    assert after["steps"] - before["steps"] == 2
    assert after["useful_tokens"] - before["useful_tokens"] == 2040
    assert after["computed_tokens"] - before["computed_tokens"] == 2048


def _mixed_calls(engine, rng: random.Random) -> None:
    """1 to 200 texts per call, 1 to max_length words each, queries and documents, embed and score."""
    words = " ".join(passages()).split()

    def texts(n):
        out = []
        for _ in range(n):
            size = rng.randint(1, engine.family.tokens.max_length)
            start = rng.randrange(len(words) - size)
            out.append(" ".join(words[start : start + size]))
        return out

    for n in (1, 200, 3, 57, 1, 129, 17):
        if not engine.family.is_cross_encoder:
            assert engine.embed(texts(n), kind=rng.choice(["document", "query"])).shape[0] == n
        assert len(engine.score(texts(1)[0], texts(n))) == n


STRICT = ["all-MiniLM-L6-v2", "bert-cross-encoder", "qwen3-embedding", "qwen3-reranker", "bert-cls", "embeddinggemma"]


@pytest.mark.parametrize("pair", STRICT, indirect=True)
def test_mixed_workload_runs_only_warmed_static_shapes(pair):
    _, bundled, _ = pair
    _mixed_calls(bundled, random.Random(7))
    stats = bundled.stats()
    buckets = stats["buckets"]
    assert stats["compiles_after_warmup"] == 0 and stats["graph_breaks"] == 0
    assert set(map(int, stats["steps_per_bucket"])) <= set(buckets)
    assert stats["compiles"] == len(buckets), "one graph per bucket, compiled during warmup"
    for graph in stats["graphs"]:
        bucket = graph["bucket"]
        assert bucket in buckets and not graph["after_warmup"]
        shapes = graph["input_shapes"]
        assert list(shapes["l_input_ids_"]) == [bucket] and list(shapes["l_positions_"]) == [bucket]
        for shape in shapes.values():  # pooling weights are [requests, bucket]; everything else [bucket]
            assert shape[-1] == bucket and all(0 < d <= bucket for d in shape)
    assert sorted(stats["warmup_seconds"]) == sorted(f"{b}/{stats['pooling_in_graph'][0]}" for b in buckets)


@pytest.mark.parametrize("pair", ["bert-cls"], indirect=True)
def test_encoder_only_model_has_no_scheduler_kv_groups_and_a_wrapped_builder(pair):
    """Both original failures: no KV group the scheduler sees, and vLLM's encoder-only builder wrapper."""
    _, bundled, _ = pair
    stats = bundled.stats()
    assert stats["kv_cache_groups"] == {"scheduler": 0, "runner_only": 1}
    assert stats["attention_builders"] == ["EncoderOnlyAttentionBuilder(PackedAttentionMetadataBuilder)"]


@pytest.mark.parametrize("pair", ["bert-cls"], indirect=True)
def test_a_second_start_finds_the_compile_cache(pair, start_engine, compile_cache):
    path, bundled, _ = pair
    first = bundled.stats()["compile_cache"]
    assert not first["reused"] and Path(first["dir"]).parent == compile_cache
    manifest = json.loads(Path(first["dir"], "graphs.json").read_text())
    assert manifest["buckets"] == bundled.stats()["buckets"] and len(manifest["graphs"]) == len(manifest["buckets"])
    with start_engine(path, "bundled") as again:
        assert again.stats()["compile_cache"] == {"dir": first["dir"], "reused": True}


@pytest.mark.parametrize("pair", ["qwen3-embedding"], indirect=True)
def test_causal_model_uses_our_builder_unwrapped(pair):
    _, bundled, _ = pair
    stats = bundled.stats()
    assert stats["kv_cache_groups"] == {"scheduler": 1, "runner_only": 0}
    assert stats["attention_builders"] == ["PackedAttentionMetadataBuilder(AttentionMetadataBuilder)"]


@pytest.fixture(scope="module")
def static_kernels(request, tiny_models, start_engine):
    path = tiny_models[request.param]
    engine = start_engine(path, "bundled", kernels="static")
    yield path, engine
    engine.close()


@pytest.mark.parametrize("static_kernels", ["bert-cross-encoder", "qwen3-embedding"], indirect=True)
def test_static_kernels_match_the_reference(static_kernels):
    """The NPU-shaped graph (torch ops only, one masked bucket attention) on the host: encoder-only with token
    types, and causal."""
    path, engine = static_kernels
    assert engine.stats()["kernels"] == "static"
    ours, expected = _outputs(engine), _reference(path, engine.family)
    for key in expected:
        assert np.abs(ours[key] - expected[key]).max() <= TOLERANCE, key
    stats = engine.stats()
    assert stats["compiles_after_warmup"] == 0 and stats["graph_breaks"] == 0


def _record_rms_norm_kernels(worker):
    """Runs inside the worker: remember which RMSNorm implementation vLLM's IR op would dispatch to, per step."""
    from vllm import ir

    runner = worker.model_runner
    runner.rms_norm_kernels = []
    forward = runner._model_forward

    def recorded(*args, **kwargs):
        runner.rms_norm_kernels.append((ir.ops.rms_norm.get_priority()[0], ir.ops.fused_add_rms_norm.get_priority()[0]))
        return forward(*args, **kwargs)

    runner._model_forward = recorded


def _recorded_kernels(engine) -> set[tuple[str, str]]:
    (kernels,) = engine._loop.run(engine._vllm.collective_rpc(lambda worker: worker.model_runner.rms_norm_kernels))
    return set(kernels)


@pytest.mark.parametrize(("pair", "static_kernels"), [("qwen3-embedding", "qwen3-embedding")], indirect=True)
def test_each_in_process_engine_steps_with_its_own_rms_norm_kernels(pair, static_kernels):
    """vLLM chooses IR op kernels once per process; in-process engines share one: host kernels (vLLM's C RMSNorm)
    for the bundled host engine, torch ops for the NPU-shaped graph and for the stock runner, whatever was built
    last."""
    _, bundled, stock = pair
    _, static = static_kernels
    engines = {"host": bundled, "static": static, "stock": stock}
    for engine in engines.values():
        engine._loop.run(engine._vllm.collective_rpc(_record_rms_norm_kernels))
    for _ in range(2):
        for engine in engines.values():
            engine.embed(TEXTS[:3])
    assert _recorded_kernels(bundled) == {("rbln_host", "rbln_host")}
    assert _recorded_kernels(static) == {("native", "native")}
    assert _recorded_kernels(stock) == {("native", "native")}
