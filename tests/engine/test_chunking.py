"""truncate="chunk" / Chunk(...): over-long texts cut into windows of the model's tokens, against the same computation
done by hand on the windows with the same engine (all-MiniLM-L6-v2 real weights; a tiny BERT cross-encoder), in
float32, locally and through `rbln-retrieval serve`."""

from __future__ import annotations

import numpy as np
import pytest

from rbln_retrieval import Chunk, ChunkedEmbedding, PoolingEngine
from rbln_retrieval.engines import windows as windows_module
from rbln_retrieval.engines.windows import embed_windowed
from rbln_retrieval.remote import RemoteEngine
from rbln_retrieval.text.chunks import embed_windows
from rbln_retrieval.text.tokens import PromptTokenizer

TOPICS = ["tides", "volcanoes", "glaciers", "monsoons", "deserts", "coral reefs", "auroras"]


def long_text(sentences: int, seed: int = 0) -> str:
    """English prose of about 20 MiniLM tokens per sentence, each sentence about one of TOPICS."""
    rng = np.random.default_rng(seed)
    return " ".join(
        f"Report {i}: the {TOPICS[int(rng.integers(len(TOPICS)))]} near station {int(rng.integers(1000))} changed "
        f"by {int(rng.integers(100))} percent this season."
        for i in range(sentences)
    )


SHORT = ["The Eiffel Tower is in Paris.", "Glaciers retreat as summers warm.", "Coral reefs bleach in hot water."]
LONG = [long_text(60, seed=1), long_text(25, seed=2), long_text(140, seed=3)]  # about 1200, 500, 2800 tokens


def windows_by_hand(hf, text: str, budget: int, overlap: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Character spans of windows of ``budget`` tokens, each starting ``overlap`` tokens before the last one
    ended, and their token counts: the documented recipe, written out."""
    offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans, counts, start = [], [], 0
    while True:
        end = min(start + budget, len(offsets))
        spans.append((offsets[start][0], offsets[end - 1][1]))
        counts.append(end - start)
        if end == len(offsets):
            return spans, counts
        start = end - overlap


def weighted_mean(vectors: np.ndarray, weights: list[int], normalize: bool = True) -> np.ndarray:
    mean = (vectors.astype(np.float64) * np.asarray(weights, dtype=np.float64)[:, None]).sum(0) / sum(weights)
    return mean / np.linalg.norm(mean) if normalize else mean


# -- embeddings (MiniLM: max_length 256, [CLS] and [SEP] around each window: 254 tokens of text) -------------------
@pytest.mark.parametrize("overlap", [0, 48])
def test_embedding_is_the_token_weighted_mean_of_the_windows_embedded_by_hand(minilm_engine, overlap):
    hf = minilm_engine.tokenizer.hf
    got = minilm_engine.embed(LONG, truncate=Chunk(overlap=overlap))
    every = minilm_engine.embed(LONG, truncate=Chunk(overlap=overlap, output="all"))
    assert got.shape == (3, 384) and got.dtype == np.float32
    for row, text, parts in zip(got, LONG, every):
        spans, counts = windows_by_hand(hf, text, 254, overlap)
        assert len(spans) >= 2 and parts.spans == spans and parts.tokens == counts
        for a, b in spans:  # every window is a well-formed input that fits: nothing was cut from it
            assert len(hf(text[a:b])["input_ids"]) <= 256
        by_hand = minilm_engine.embed([text[a:b] for a, b in spans], truncate="error")
        np.testing.assert_allclose(parts.vectors, by_hand, atol=1e-6)
        expected = weighted_mean(by_hand, counts)
        diff = np.abs(row - expected).max()
        print(f"overlap={overlap}: {len(spans)} windows, max abs diff vs by hand {diff:.2e}")
        assert diff < 1e-6
        assert np.abs(row - minilm_engine.embed([text])[0]).max() > 1e-3, "chunking must differ from a cut"


def test_unnormalized_embeddings_are_the_plain_weighted_mean(minilm_engine):
    got = minilm_engine.embed(LONG[:1], truncate="chunk", normalize=False)[0]
    (parts,) = minilm_engine.embed(LONG[:1], truncate=Chunk(output="all"), normalize=False)
    by_hand = minilm_engine.embed([LONG[0][a:b] for a, b in parts.spans], normalize=False)
    np.testing.assert_allclose(got, weighted_mean(by_hand, parts.tokens, normalize=False), atol=1e-5)
    assert abs(np.linalg.norm(got) - 1) > 1e-2  # MiniLM's unnormalized vectors are not unit vectors


def test_texts_that_fit_are_embedded_exactly_as_without_chunking(minilm_engine):
    for truncate in ("chunk", Chunk(overlap=100)):
        np.testing.assert_array_equal(minilm_engine.embed(SHORT, truncate=truncate), minilm_engine.embed(SHORT))
    (one,) = minilm_engine.embed(SHORT[:1], truncate=Chunk(output="all"))
    assert isinstance(one, ChunkedEmbedding) and one.spans == [(0, len(SHORT[0]))] and one.vectors.shape == (1, 384)


def test_order_and_count_follow_the_input(minilm_engine):
    mixed = [LONG[0], SHORT[0], LONG[2], SHORT[1], LONG[1], SHORT[2]]
    got = minilm_engine.embed(iter(mixed), truncate="chunk")  # a one-pass iterator
    assert got.shape == (6, 384)
    alone = np.stack([minilm_engine.embed([t], truncate="chunk")[0] for t in mixed])
    np.testing.assert_allclose(got, alone, atol=1e-6)
    every = minilm_engine.embed(mixed, truncate=Chunk(output="all"))
    assert [len(p.spans) for p in every] == [
        len(windows_by_hand(minilm_engine.tokenizer.hf, t, 254, 0)[0]) for t in mixed
    ]
    assert minilm_engine.embed([], truncate="chunk").shape == (0, 384)
    assert minilm_engine.embed([], truncate=Chunk(output="all")) == []


def test_a_query_prompt_is_in_every_window(minilm_engine):
    """An instruction stands before each window and counts against its length."""
    prefix = "Represent this report for retrieval: "
    got = minilm_engine.embed(LONG[:1], kind="query", instruction=prefix, truncate=Chunk(output="all"))[0]
    budget = 256 - len(minilm_engine.tokenizer.hf(prefix)["input_ids"])
    spans, _ = windows_by_hand(minilm_engine.tokenizer.hf, LONG[0], budget, 0)
    assert got.spans == spans
    by_hand = minilm_engine.embed([prefix + LONG[0][a:b] for a, b in spans], truncate="error")
    np.testing.assert_allclose(got.vectors, by_hand, atol=1e-6)


def test_cosine_scores_take_the_best_window(minilm_engine):
    query = "How much did the glaciers change?"
    docs = [SHORT[0], LONG[0], SHORT[1], LONG[2]]
    scores = minilm_engine.score(query, docs, truncate="chunk")
    q = minilm_engine.embed([query], kind="query")[0]
    for score, doc in zip(scores, docs):
        spans, _ = windows_by_hand(minilm_engine.tokenizer.hf, doc, 254, 0)
        assert score == pytest.approx(float((minilm_engine.embed([doc[a:b] for a, b in spans]) @ q).max()), abs=1e-6)
    ranking = minilm_engine.rerank(query, docs, truncate="chunk", top_n=3)
    assert [i for i, _ in ranking] == list(np.argsort(scores)[::-1][:3])


# -- cross-encoder (tiny BERT, max_length 32: the query's tokens leave fewer for each window) -----------------------
@pytest.fixture(scope="module")
def reranker(tiny_model):
    engine = PoolingEngine(tiny_model("bert-cross-encoder"), device="cpu", dtype="float32", max_length=32)
    yield engine
    engine.close()


def test_reranker_scores_a_document_by_its_best_query_window_pair(reranker):
    hf = reranker.tokenizer.hf
    query = "glacier changes at station 12"
    docs = [long_text(6, seed=4), "Short note on tides.", long_text(9, seed=5)]
    budget = 32 - 3 - len(hf(query, add_special_tokens=False)["input_ids"])  # [CLS] query [SEP] window [SEP]
    scores = reranker.score(query, docs, truncate=Chunk(overlap=4))
    assert len(scores) == 3
    diffs = []
    for score, doc in zip(scores, docs):
        spans, _ = windows_by_hand(hf, doc, budget, 4)
        windows = [doc[a:b] for a, b in spans]
        assert all(len(hf(query, w)["input_ids"]) <= 32 for w in windows)
        by_hand = reranker.score(query, windows, truncate="error")
        diffs.append(abs(score - max(by_hand)))
    print(f"reranker: max abs diff vs by hand {max(diffs):.2e}")
    assert max(diffs) < 1e-6
    assert reranker.score(query, docs[1:2], truncate="chunk") == reranker.score(query, docs[1:2])
    ranking = reranker.rerank(query, docs, truncate=Chunk(overlap=4))
    assert sorted(i for i, _ in ranking) == [0, 1, 2] and [s for _, s in ranking] == sorted(scores, reverse=True)


# -- bad input: one sentence each -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Chunk(overlap=-1), ValueError, "Chunk overlap=-1 is negative"),
        (lambda: Chunk(overlap=1.5), TypeError, "Chunk overlap is float, expected int"),
        (lambda: Chunk(overlap=True), TypeError, "Chunk overlap is bool"),
        (lambda: Chunk(output="max"), ValueError, "Chunk output='max' is not 'mean'"),
    ],
)
def test_bad_chunk_options(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_bad_chunking_calls_are_refused_in_one_sentence(minilm_engine, reranker):
    cases = [
        (lambda: minilm_engine.embed(LONG, truncate=Chunk(overlap=254)), "Chunk overlap=254 must be below the 254"),
        (lambda: minilm_engine.embed(LONG, truncate="chunks"), "truncate='chunks' is not one of"),
        (
            lambda: minilm_engine.embed(LONG, truncate=Chunk(output="all"), precision="ubinary"),
            "Chunk\\(output='all'\\) gives float32 window vectors",
        ),
        (lambda: minilm_engine.score("q", LONG, truncate=Chunk(output="all")), "applies to embed"),
        (lambda: minilm_engine.score("q", LONG, truncate="chunk", output="multi_vector"), "combines dense vectors"),
        (
            lambda: reranker.score(" ".join(["glacier"] * 40), LONG, truncate="chunk"),
            "The query and special tokens alone take 43 of max_length=32",
        ),
        (lambda: reranker.embed(SHORT, truncate="chunk"), "is a reranker"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)


def test_a_tokenizer_without_max_length_cannot_chunk(minilm_engine, minilm):

    family = minilm_engine.family.replace(max_length=0)
    with pytest.raises(ValueError, match="max_length, which is unknown; pass max_length="):
        embed_windows(PromptTokenizer(minilm, family), "", Chunk())


# -- memory: windows stream through in bounded batches ---------------------------------------------------------------
async def test_windows_stream_through_in_bounded_batches(minilm_engine, monkeypatch):
    """A stream of long texts is read a chunk of texts at a time and its windows embedded WINDOW_BATCH at a
    time; rows are combined as each text completes, never all held."""
    monkeypatch.setattr(windows_module, "WINDOW_BATCH", 5)
    monkeypatch.setattr("rbln_retrieval.text.inputs.CHUNK_SIZE", 4)
    consumed, batches = [], []

    def texts():
        for i in range(12):
            consumed.append(i)
            yield LONG[i % 3]

    async def embed(windows: list[str]) -> np.ndarray:
        batches.append((len(windows), len(consumed)))
        return np.ones((len(windows), 3), dtype=np.float32) * np.arange(len(windows))[:, None]

    windows = embed_windows(minilm_engine.tokenizer, "", Chunk())
    got = await embed_windowed(windows, texts(), Chunk(), normalize=True, embed=embed)
    assert got.shape == (12, 3)
    assert max(n for n, _ in batches) <= 5
    assert batches[0][1] == 4, "the first windows were embedded before the fifth text was read"


# -- remote: the client cuts the windows with the model's tokenizer, the server embeds and scores them --------------
def test_remote_chunking_equals_local(minilm_engine, minilm_server, minilm):
    texts = [SHORT[0], LONG[0], LONG[2], SHORT[1]]
    query = "How much did the glaciers change?"
    with RemoteEngine(str(minilm), base_url=minilm_server.url) as remote:
        for truncate in ("chunk", Chunk(overlap=32)):
            np.testing.assert_allclose(
                remote.embed(texts, truncate=truncate), minilm_engine.embed(texts, truncate=truncate), atol=1e-5
            )
            local = minilm_engine.score(query, texts, truncate=truncate)
            assert remote.score(query, texts, truncate=truncate) == pytest.approx(local, abs=1e-5)
        parts = remote.embed(texts, truncate=Chunk(output="all"))
        for got, want in zip(parts, minilm_engine.embed(texts, truncate=Chunk(output="all"))):
            assert got.spans == want.spans and got.tokens == want.tokens
            np.testing.assert_allclose(got.vectors, want.vectors, atol=1e-5)
        quantized = remote.embed(texts, truncate="chunk", precision="ubinary")
        np.testing.assert_array_equal(quantized, minilm_engine.embed(texts, truncate="chunk", precision="ubinary"))


def test_remote_chunking_without_the_tokenizer_on_this_machine_is_one_sentence(minilm_server):
    # The server's only model answers whatever the client names it; its files are not on this machine.
    with RemoteEngine("example-org/not-on-this-machine", base_url=minilm_server.url) as remote:
        assert remote.embed(SHORT[:1]).shape == (1, 384)
        with pytest.raises(
            ValueError, match="truncate='chunk' cuts windows with example-org/not-on-this-machine's"
        ) as info:
            remote.embed(LONG, truncate="chunk")
        assert "\n" not in str(info.value)
