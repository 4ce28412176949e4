"""all-MiniLM-L6-v2 with real weights against sentence-transformers, and the engine's public behaviour."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from corpus import mixed_length

from rbln_retrieval import PoolingEngine

# Ten short passages and the question each one answers, written for this test.
PASSAGES = [
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Photosynthesis converts sunlight, water and carbon dioxide into glucose and oxygen.",
    "The Pacific Ocean is the largest and deepest of Earth's oceans.",
    "Mount Everest, on the border of Nepal and China, is the highest mountain above sea level.",
    "Insulin is a hormone made by the pancreas that regulates blood sugar.",
    "The Great Fire of London in 1666 destroyed much of the medieval city.",
    "Python lists are mutable sequences, while tuples cannot be changed after creation.",
    "Honey bees communicate the location of flowers with a waggle dance.",
    "The speed of light in a vacuum is about 299,792 kilometres per second.",
    "Beethoven's Ninth Symphony ends with a choral setting of Schiller's Ode to Joy.",
]
QUESTIONS = [
    "When was the Eiffel Tower built?",
    "How do plants make sugar from sunlight?",
    "Which ocean is the biggest?",
    "What is the tallest mountain in the world?",
    "Which organ produces insulin?",
    "What disaster burned London in the 17th century?",
    "What is the difference between a list and a tuple in Python?",
    "How do bees tell each other where flowers are?",
    "How fast does light travel?",
    "Which symphony includes the Ode to Joy?",
]


@pytest.fixture(scope="module")
def sentence_transformer(minilm):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm), device="cpu")


def test_parity_with_sentence_transformers_on_mixed_lengths(minilm_engine, sentence_transformer):
    texts = mixed_length(240)
    lengths = [len(ids) for ids in sentence_transformer.tokenizer(texts)["input_ids"]]
    assert sum(n > 256 for n in lengths) >= 8, "the corpus must exercise truncation"
    ours = minilm_engine.embed(texts)
    reference = sentence_transformer.encode(texts, batch_size=32, normalize_embeddings=True)
    assert ours.shape == reference.shape == (240, 384) and ours.dtype == np.float32
    cosines = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= 0.99999, f"min cosine {cosines.min():.7f}"


def test_labeled_questions_find_their_passage_first(minilm_engine):
    for question, (index, _) in zip(QUESTIONS, [r[0] for r in _rankings(minilm_engine)]):
        assert QUESTIONS.index(question) == index, f"{question!r} ranked passage {index} first"


def _rankings(engine):
    return [engine.rerank(q, PASSAGES, top_n=3) for q in QUESTIONS]


def test_score_is_cosine_of_query_and_document_vectors(minilm_engine):
    scores = minilm_engine.score(QUESTIONS[0], PASSAGES)
    q = minilm_engine.embed([QUESTIONS[0]], kind="query")[0]
    d = minilm_engine.embed(PASSAGES)
    np.testing.assert_allclose(scores, d @ q, atol=1e-6)
    assert all(type(s) is float for s in scores)


def _same_ranking(got, want):
    """Same indices in the same order; scores equal up to float noise (a step's batch changes summation order)."""
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)


def test_rerank_orders_by_score_and_respects_top_n(minilm_engine):
    scores = minilm_engine.score(QUESTIONS[2], PASSAGES)
    ranked = minilm_engine.rerank(QUESTIONS[2], PASSAGES)
    assert [i for i, _ in ranked] == sorted(range(10), key=lambda i: -scores[i])
    _same_ranking(minilm_engine.rerank(QUESTIONS[2], PASSAGES, top_n=2), ranked[:2])
    assert minilm_engine.rerank(QUESTIONS[2], PASSAGES, top_n=0) == []
    assert minilm_engine.rerank(QUESTIONS[2], PASSAGES, top_n=-1) == []
    _same_ranking(minilm_engine.rerank(QUESTIONS[2], PASSAGES, top_n=50), ranked)
    assert minilm_engine.rerank(QUESTIONS[2], []) == []


def test_normalize_false_returns_the_raw_pooled_vector(minilm_engine):
    raw = minilm_engine.embed(PASSAGES[:3], normalize=False)
    unit = minilm_engine.embed(PASSAGES[:3])
    norms = np.linalg.norm(raw, axis=1)
    assert not np.allclose(norms, 1.0)
    np.testing.assert_allclose(raw / norms[:, None], unit, atol=1e-6)


async def test_async_equals_sync_and_concurrent_calls_keep_their_order(minilm_engine):
    texts = mixed_length(60)
    expected = minilm_engine.embed(texts)
    chunks = [texts[i : i + 7] for i in range(0, 60, 7)]
    results = await asyncio.gather(*(minilm_engine.aembed(c) for c in chunks))
    np.testing.assert_allclose(np.concatenate(results), expected, atol=1e-6)
    assert await minilm_engine.ascore(QUESTIONS[1], PASSAGES) == pytest.approx(
        minilm_engine.score(QUESTIONS[1], PASSAGES), abs=1e-6
    )
    assert [i for i, _ in await minilm_engine.arerank(QUESTIONS[1], PASSAGES, top_n=1)] == [1]


async def test_async_call_does_not_block_the_event_loop(minilm_engine):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    await minilm_engine.aembed(mixed_length(200))
    task.cancel()
    assert ticks > 5, "the caller's loop stalled while the engine worked"


def test_iterator_input_is_consumed_in_order(minilm_engine):
    texts = mixed_length(30)
    np.testing.assert_allclose(minilm_engine.embed(iter(texts)), minilm_engine.embed(texts), atol=1e-6)


def test_progress_bar_on_request(minilm_engine, capsys):
    minilm_engine.embed(PASSAGES, show_progress=True)
    assert "10/10" in capsys.readouterr().err


def test_shared_returns_one_engine_per_model_and_options(minilm, minilm_engine):
    assert PoolingEngine.shared(minilm, device="cpu", dtype="float32").engine is minilm_engine.engine
    assert PoolingEngine.shared(str(minilm), dtype="float32", device="cpu").engine is minilm_engine.engine
    # truncate is applied per call by the tokenizer: it never starts a second engine.
    assert PoolingEngine.shared(minilm, device="cpu", dtype="float32", truncate="start").engine is minilm_engine.engine


def test_truncate_error_names_the_index_and_token_count(minilm):
    long_text = " ".join(f"word{i}" for i in range(2000))
    engine = PoolingEngine.shared(minilm, device="cpu", dtype="float32", truncate="error")
    with pytest.raises(ValueError, match=r"texts\[1\] is \d+ tokens, over max_length=256"):
        engine.embed(["short", long_text])
    assert engine.embed(["short"]).shape == (1, 384)


def test_truncate_end_keeps_the_start_and_start_keeps_the_end_and_the_prompt(minilm_engine, minilm):
    from rbln_retrieval.text.tokens import PromptTokenizer

    long_text = " ".join(f"w{i}" for i in range(2000))
    family = minilm_engine.family
    tokenizer = PromptTokenizer(minilm, family)
    head = tokenizer.encode_texts([long_text], "", "end")[0].ids
    tail = tokenizer.encode_texts([long_text], "query: ", "start")[0].ids
    assert len(head) == len(tail) == 256
    decode = tokenizer.hf.decode
    assert decode(head[:4]).startswith("[CLS] w0 ")
    assert decode(tail[:4]).startswith("[CLS] query :")
    assert decode(tail).endswith("w1999 [SEP]")


@pytest.mark.parametrize("truncate", ["end", "start"])
def test_long_texts_tokenize_as_if_whole(minilm, truncate):
    """Only a window of a long text is tokenized; the kept tokens equal those of tokenizing it whole, including
    texts whose window holds too few tokens (one huge word; words of over CHARS_PER_TOKEN characters each)."""
    from rbln_retrieval.models.families import detect_family
    from rbln_retrieval.text.tokens import PromptTokenizer

    tokenizer = PromptTokenizer(minilm, detect_family(str(minilm)))
    hf = tokenizer._for(truncate)
    texts = ["short", "word " * 3000, "x" * 20000, "日本語のテキストです" * 2000, "a " * 5000 + "b" * 3000]
    texts.append(("y" * 120 + " ") * 200)
    whole = hf(["query: " + t for t in texts], truncation=truncate == "end", max_length=256)["input_ids"]
    if truncate == "start":
        whole = [ids if len(ids) <= 256 else tokenizer._keep_end(hf, "query: ", t) for ids, t in zip(whole, texts)]
    assert [t.ids for t in tokenizer.encode_texts(texts, "query: ", truncate)] == whole


class SeenLengths:
    """A tokenizer that records the longest text it was given, and tokenizes as the one it wraps."""

    def __init__(self, hf):
        self.hf, self.longest = hf, 0

    def __call__(self, text, *args, **kwargs):
        self.longest = max([self.longest, *(len(t) for t in ([text] if isinstance(text, str) else text))])
        return self.hf(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.hf, name)


@pytest.mark.parametrize("truncate", ["end", "start"])
def test_a_run_without_whitespace_is_cut_at_the_window_not_tokenized_whole(minilm, truncate):
    """400 KB without a space (or a run without one as long as the window's outer half) is cut at the window's edge
    before tokenizing: the tokenizer never meets more than the window, and the kept tokens are the window's."""
    from rbln_retrieval.models.families import detect_family
    from rbln_retrieval.text.tokens import CHARS_PER_TOKEN, PromptTokenizer

    tokenizer = PromptTokenizer(minilm, detect_family(str(minilm)))
    side = "left" if truncate == "start" else "right"
    hf = tokenizer._for(truncate)
    spy = tokenizer._by_side[side] = SeenLengths(hf)
    limit = tokenizer.max_length * CHARS_PER_TOKEN
    texts = ["x" * 400_000, "a " * 5000 + "b" * 400_000, "b" * 400_000 + " a" * 5000, "日本" * 200_000]
    got = [t.ids for t in tokenizer.encode_texts(texts, "query: ", truncate)]
    assert spy.longest <= limit + len("query: "), f"a {spy.longest}-character text was tokenized"
    windows = [t[:limit] if truncate == "end" else t[-limit:] for t in texts]
    expected = hf(["query: " + w for w in windows], truncation=truncate == "end", max_length=256)["input_ids"]
    if truncate == "start":
        expected = [
            ids if len(ids) <= 256 else tokenizer._keep_end(hf, "query: ", w) for ids, w in zip(expected, windows)
        ]
    assert got == expected


def test_tokenizing_with_truncation_on_and_off_from_many_threads_at_once(minilm):
    """Concurrent requests with different truncation policies tokenize on worker threads at once: each call sets
    the Rust tokenizer's truncation, which fails ("Already borrowed") while another call encodes, unless the calls
    take turns. Every thread's ids equal those of the same call made alone."""
    from concurrent.futures import ThreadPoolExecutor

    from rbln_retrieval.models.families import detect_family
    from rbln_retrieval.text.tokens import PromptTokenizer

    tokenizer = PromptTokenizer(minilm, detect_family(str(minilm)))
    texts = [f"passage {i} " + "word " * (50 + 40 * (i % 9)) for i in range(64)]
    policies = ["end", "error", "end", "start"] * 10  # "end" truncates, "error" does not: each call sets which

    def alone(truncate):
        try:
            return [t.ids for t in tokenizer.encode_texts(texts, "", truncate)]
        except ValueError as error:  # truncate="error" on texts over 256 tokens: the same sentence every time
            return str(error)

    want = {p: alone(p) for p in set(policies)}
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(alone, policies))
    assert got == [want[p] for p in policies]
