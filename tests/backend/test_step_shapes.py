"""Static (NPU) steps compute what they use: rows x width shapes with attention per row (backend/rows.py).

The engine tests run the rbln target against the stand-in compiler at the shapes a user gets (no test settings),
count FLOPs where the compiler receives the graphs (the stand-in counts each lowered graph), and hold them against
the same texts run one at a time at their exact lengths through plain transformers: useful/computed FLOPs >= 0.85
for MiniLM and for BERT-base- and Qwen3-0.6B-shaped models (their widths, two layers: the ratio does not depend on
depth), useful/computed tokens >= 0.95, at most 16 graphs, nothing compiled after warmup."""

from __future__ import annotations

import asyncio
import random
import re

import numpy as np
import pytest
import torch
from corpus import mixed_length, passages
from model_builders import build_bert_base_shaped, build_qwen3_shaped, minilm_path
from npu import start_rbln
from reference import useful_flops

from rbln_retrieval.backend.attention.backend import packed_attention
from rbln_retrieval.backend.config import engine_overrides
from rbln_retrieval.backend.step import rows

TEXTS = mixed_length(80)  # one word to thousands (truncated at max_length)


# -- shapes, packing and layout, no engine -----------------------------------------------------------------------
def test_default_shapes_are_64_aligned_rows_within_sixteen_graphs():
    assert rows.derive_shapes(256, 4096) == [(1, 64), (1, 128), (1, 256), (2, 256), (4, 256), (8, 256), (16, 256)]
    assert rows.derive_shapes(512, 4096) == [
        (1, 64),
        (1, 128),
        (1, 256),
        (2, 256),
        (1, 512),
        (4, 256),
        (8, 256),
        (16, 256),
    ]
    for length in (1, 100, 300, 512, 8192, 32768):
        shapes = rows.derive_shapes(length, 4096)
        assert len(shapes) <= rows.MAX_SHAPES and max(w for _, w in shapes) >= length
        assert all(w % 64 == 0 for _, w in shapes) and len(set(shapes)) == len(shapes)


def test_bad_shape_settings_are_one_sentence():
    def overrides(**user):
        return engine_overrides(
            target="rbln", max_length=512, model="m", dtype="float32", strict_shapes=False, user=user, npu="RBLN-CA25"
        )

    kw = overrides()["additional_config"]["rbln_retrieval"]
    assert kw["rows"] and kw["kernels"] == "static" and overrides()["max_num_batched_tokens"] == 4096
    for user, message in [
        ({"buckets": [64, 512]}, re.escape("static kernels (and device='rbln') take shapes=[[rows, width], ...]")),
        ({"shapes": [[1, 100]]}, r"shape \[1, 100\]: the row width must be a multiple of 64 tokens"),
        ({"shapes": [[2, 256]]}, r"must include a row of at least max_length=512"),
        ({"shapes": [[0, 512]]}, r"shape \[0, 512\] must be \[rows, width\] with both positive"),
        ({"row_width": 100}, "row_width=100 must be a positive multiple of 64"),
    ]:
        with pytest.raises(ValueError, match=message):
            overrides(**user)
    with pytest.raises(ValueError, match="shapes shapes the static kernels' steps; the host kernels take buckets"):
        engine_overrides(
            target="host", max_length=512, model="m", dtype="float32", strict_shapes=False, user={"shapes": [[1, 512]]}
        )


def test_layout_depends_on_lengths_not_order_and_inverts():
    rng = random.Random(0)
    costs = rows.Costs(ratio=2304.0, step_tokens=64)
    shapes = rows.derive_shapes(256, 4096)
    for _ in range(200):
        lengths = [rng.randint(1, 256) for _ in range(rng.randint(1, 40))]
        shape, taken = rows.choose(lengths, shapes, costs, max_requests=256)
        assert 0 in taken, "the oldest prompt is always in the step"
        step = [lengths[i] for i in taken]
        layout = rows.plan(step, shapes, costs)
        assert costs.shape(*layout.shape) <= costs.shape(*shape), "the runner's shape is no dearer than planned"
        by_length = sorted(range(len(step)), key=lambda j: -step[j])
        if rows._first_fit_offsets(step, by_length, layout.shape) is not None:  # first-fit-decreasing packed it
            assert rows.plan(rng.sample(step, len(step)), shapes, costs).shape == layout.shape
        flat = layout.seq_ids.reshape(-1)
        for i, (start, n) in enumerate(zip(layout.starts, layout.lengths)):
            assert (flat[start : start + n] == i).all() and (start % layout.shape[1]) + n <= layout.shape[1]
        real = sum(step)
        assert (flat >= 0).sum() == real and (layout.source[layout.slot_of] == np.arange(real)).all()


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (False, 3), (True, 129)])
def test_row_attention_matches_per_prompt_attention(causal, window):
    torch.manual_seed(0)
    lengths = [5, 1, 200, 37, 250, 100, 120, 64]
    layout = rows.plan(lengths, [(4, 256)], rows.Costs(1000.0, 64))
    tokens = layout.tokens
    q, k, v = torch.randn(tokens, 4, 32), torch.randn(tokens, 2, 32), torch.randn(tokens, 2, 32)
    out = packed_attention(q, k, v, torch.from_numpy(layout.seq_ids), causal, 0.17, window)
    assert torch.isfinite(out).all(), "padding slots feed later layers and must stay finite"
    for start, n in zip(layout.starts, layout.lengths):
        s = slice(start, start + n)
        band = torch.ones(n, n, dtype=torch.bool)
        if window is not None:
            band = band.tril(window - 1).triu(1 - window)
        if causal:
            band = band.tril()
        kk, vv = (t[s].repeat_interleave(2, dim=1).transpose(0, 1) for t in (k, v))
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[s].transpose(0, 1), kk, vv, attn_mask=band, scale=0.17
        ).transpose(0, 1)
        assert (out[s] - expected).abs().max() < 1e-5


# -- the rbln target at default shapes, FLOPs counted where the compiler gets the graphs -------------------------
SHAPED = {"all-MiniLM-L6-v2": None, "bert-base-shaped": build_bert_base_shaped, "qwen3-0.6b-shaped": build_qwen3_shaped}


@pytest.fixture(scope="module")
def shaped(request, standin_rebel, tmp_path_factory):
    """(path, engine, the stand-in's record of its graphs) for ``request.param``, at default shapes."""
    build = SHAPED[request.param]
    path = minilm_path() if build is None else build(tmp_path_factory.mktemp(request.param))
    first = len(standin_rebel.COMPILED)
    engine = start_rbln(path, "RBLN-CR13", default_shapes=True)
    try:
        yield path, engine, standin_rebel.COMPILED[first:]
    finally:
        engine.close()


@pytest.mark.parametrize("shaped", list(SHAPED), indirect=True)
def test_npu_steps_compute_what_they_use(shaped):
    path, engine, compiled = shaped
    engine.embed(TEXTS)
    stats = engine.stats()
    assert len(compiled) == stats["compiles"] == len(stats["buckets"]) <= rows.MAX_SHAPES
    assert stats["compiles_after_warmup"] == 0
    # The stand-in's count of each graph it lowered, by shape: the runner's own count must agree.
    counted = {graph["bucket"]: standin.flops for graph, standin in zip(stats["graphs"], compiled)}
    for label, cost in stats["graph_costs"].items():
        assert cost["flops"] == pytest.approx(counted[label], rel=1e-6), label
    computed = sum(counted[label] * steps for label, steps in stats["steps_per_bucket"].items())
    assert stats["computed_flops"] == pytest.approx(computed, rel=1e-6)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    lengths = [
        len(ids) for ids in tokenizer(TEXTS, truncation=True, max_length=engine.family.tokens.max_length)["input_ids"]
    ]
    assert sum(lengths) == stats["useful_tokens"]
    useful = useful_flops(path, lengths)
    ratio = useful / computed
    print(
        f"{path.name}: useful/computed FLOPs {ratio:.3f}, "
        f"tokens {stats['useful_tokens'] / stats['computed_tokens']:.3f}, "
        f"steps {stats['steps_per_bucket']}, largest activation "
        f"{max(c['largest_activation'] for c in stats['graph_costs'].values()) / 2**20:.1f} MiB"
    )
    assert ratio >= 0.85
    assert stats["useful_flops"] == pytest.approx(useful, rel=0.03), "stats' estimate of the useful FLOPs"
    assert stats["useful_tokens"] / stats["computed_tokens"] >= 0.95


@pytest.mark.parametrize("shaped", ["all-MiniLM-L6-v2"], indirect=True)
def test_many_small_concurrent_calls_pack_into_full_rows(shaped):
    _, engine, _ = shaped
    texts = passages(min_words=3)[:600]
    before = engine.stats()

    async def calls():
        sizes = [1 + i % 4 for i in range(240)]
        starts = np.cumsum([0, *sizes[:-1]])
        return await asyncio.gather(*(engine.aembed(texts[s : s + n]) for s, n in zip(starts, sizes)))

    results = engine._loop.run(calls()) if hasattr(engine, "_loop") else asyncio.run(calls())
    assert [len(r) for r in results] == [1 + i % 4 for i in range(240)]
    after = engine.stats()
    useful = after["useful_tokens"] - before["useful_tokens"]
    computed = after["computed_tokens"] - before["computed_tokens"]
    assert useful / computed >= 0.95, (useful, computed, after["steps_per_bucket"])
