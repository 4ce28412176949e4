"""Bad and messy input through the public API: every row of docs/reliability.md has a defined result, and every
successful call returns exactly one result per input, in input order (a misplaced vector is silent corruption)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import psutil
import pytest
from corpus import passages

from rbln_retrieval import PoolingEngine
from rbln_retrieval.text.inputs import CHUNK_SIZE
from rbln_retrieval.text.tokens import PromptTokenizer

ONE_MB = 1 << 20
QUERY = "How do I open a file in Python?"


class PeakRSS:
    """Peak resident memory of this process above its level at entry, sampled every few milliseconds."""

    def __init__(self, interval: float = 0.005):
        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.growth = 0

    def __enter__(self) -> PeakRSS:
        self._base = self._peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._process.memory_info().rss)
            time.sleep(self._interval)

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._process.memory_info().rss)
        self.growth = self._peak - self._base


def one_by_one(embed: Callable[[list[str]], np.ndarray], texts: list[str]) -> np.ndarray:
    return np.concatenate([embed([t]) for t in texts])


@pytest.fixture(scope="module")
def megabyte_text() -> str:
    """About 1 MB of real prose (the Python docs, repeated)."""
    text = " ".join(passages(min_words=3))
    return (text * (ONE_MB // len(text) + 1))[:ONE_MB]


def test_a_megabyte_text_is_truncated_at_the_end_with_bounded_memory(minilm_engine, megabyte_text):
    minilm_engine.embed(["warm up"])
    with PeakRSS() as rss:
        vectors = minilm_engine.embed(["short", megabyte_text, "short"])
    print(f"\n1 MB text: peak RSS growth {rss.growth / 2**20:.1f} MiB")
    assert vectors.shape == (3, 384) and np.isfinite(vectors).all()
    # truncate="end" keeps the first 256 tokens: the same vector as the first few kilobytes of the text.
    np.testing.assert_allclose(vectors[1], minilm_engine.embed([megabyte_text[:4000]])[0], atol=1e-5)
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)
    # Only a window of the text is tokenized (tokens.CHARS_PER_TOKEN): measured 1.6 MiB, against ~200 MiB whole.
    assert rss.growth < 32 * 2**20, f"embedding one 1 MB text grew RSS by {rss.growth / 2**20:.0f} MiB"


def test_a_megabyte_text_under_truncate_start_and_error(minilm, minilm_engine, megabyte_text):
    # The call's policy picks the tokenizer's side; no engine is needed to prove it.
    family = minilm_engine.family
    tokenizer = PromptTokenizer(minilm, family)
    tail = tokenizer.encode_texts([megabyte_text], "", "start")[0].ids
    assert len(tail) == family.tokens.max_length
    with pytest.raises(ValueError, match=r"texts\[4\] is \d{6,} tokens, over max_length=256 \(truncate='error'"):
        tokenizer.encode_texts(["a"] * 4 + [megabyte_text], "", "error")


CONTROL = [
    "nul\x00inside",
    "\x00",
    "bell\x07 escape\x1b[31m red",
    "tab\tnew\nline\rcr",
    "\x7f\x85\u200b\ufeff",
    "line\u2028separator",
    "surrogate-free \U0010fffd private use",
]
SCRIPTS = [
    "😀🚀👍🏽 emoji only",
    "مرحبا بالعالم، هذا نص عربي",
    "שלום עולם",
    "\u202eRTL override\u202c text",
    "日本語のテキストです",
    "中文文本检索",
    "한국어 문장",
    "mixed: Paris 파리 باريس 巴黎 🗼",
]


@pytest.mark.parametrize("texts", [CONTROL, SCRIPTS], ids=["nul-and-control", "emoji-rtl-cjk"])
def test_unusual_characters_get_their_own_vector_in_order(minilm_engine, texts):
    vectors = minilm_engine.embed(texts)
    assert vectors.shape == (len(texts), 384) and np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, one_by_one(minilm_engine.embed, texts), atol=1e-5)
    reversed_vectors = minilm_engine.embed(texts[::-1])
    np.testing.assert_allclose(reversed_vectors[::-1], vectors, atol=1e-5)
    scores = minilm_engine.score(texts[0], texts)
    assert len(scores) == len(texts) and all(np.isfinite(scores))


def test_ten_thousand_identical_texts_get_ten_thousand_identical_vectors(tiny_engine):
    text = "The same sentence, ingested again and again."
    vectors = tiny_engine.embed([text] * 10_000)
    assert vectors.shape == (10_000, tiny_engine.dimension)
    np.testing.assert_allclose(vectors, np.broadcast_to(tiny_engine.embed([text]), vectors.shape), atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_generator_of_100k_texts_is_processed_in_bounded_chunks(tiny_engine):
    n = 100_000
    pulled = 0

    def texts() -> Iterator[str]:
        nonlocal pulled
        for i in range(n):
            pulled += 1
            yield f"document number {i} of the stream"

    # (texts pulled from the generator, requests inside vLLM), sampled while the call runs.
    samples: list[tuple[int, int]] = []
    running = threading.Event()
    running.set()

    def sample() -> None:
        while running.is_set():
            samples.append((pulled, tiny_engine._vllm.get_num_unfinished_requests()))
            time.sleep(0.01)

    tiny_engine.embed(["warm up"])
    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    with PeakRSS() as rss:
        sampler.start()
        try:
            vectors = tiny_engine.embed(texts())
        finally:
            running.clear()
            sampler.join()
    seconds = time.monotonic() - started
    output = vectors.nbytes
    print(
        f"\n100,000 texts from a generator: {seconds:.0f} s; peak RSS growth {rss.growth / 2**20:.0f} MiB "
        f"for a {output / 2**20:.0f} MiB result ({rss.growth / output:.2f}x)"
    )
    assert pulled == n and vectors.shape == (n, tiny_engine.dimension)
    # Chunked: the engine computes while most of the generator is still unread, never more than a chunk at once.
    assert any(busy and count < n // 2 for count, busy in samples), "the generator was drained before any work"
    assert max(busy for _, busy in samples) <= CHUNK_SIZE
    # The result itself must be held; everything else (prompts, tokens, requests in flight) is one chunk at a time.
    assert rss.growth < 2 * output + 256 * 2**20
    sample_rows = [*range(0, n, 9_973), n - 1]
    expected = tiny_engine.embed([f"document number {i} of the stream" for i in sample_rows])
    np.testing.assert_allclose(vectors[sample_rows], expected, atol=1e-5)


def test_one_result_per_input_in_input_order(minilm_engine):
    docs = [p for p in passages(min_words=5)][:200]
    texts = [*docs, "", " ", docs[0], docs[0]]  # duplicates and empties keep their own slots
    vectors = minilm_engine.embed(texts)
    assert vectors.shape == (len(texts), 384)
    permutation = np.random.default_rng(7).permutation(len(texts))
    shuffled = minilm_engine.embed([texts[i] for i in permutation])
    np.testing.assert_allclose(shuffled, vectors[permutation], atol=1e-5)
    np.testing.assert_allclose(vectors[-2:], np.stack([vectors[0], vectors[0]]), atol=1e-5)
    scores = minilm_engine.score(QUERY, texts)
    shuffled_scores = minilm_engine.score(QUERY, [texts[i] for i in permutation])
    assert shuffled_scores == pytest.approx([scores[i] for i in permutation], abs=1e-5)


@pytest.mark.parametrize("top_n, expected", [(-5, 0), (0, 0), (3, 3), (10_000, 7)])
def test_rerank_top_n_negative_zero_and_larger_than_the_input(minilm_engine, top_n, expected):
    docs = passages(min_words=5)[:7]
    ranked = minilm_engine.rerank(QUERY, docs, top_n=top_n)
    assert len(ranked) == expected
    scores = minilm_engine.score(QUERY, docs)
    best_first = sorted(range(7), key=lambda i: -scores[i])[:expected]
    assert [i for i, _ in ranked] == best_first
    assert [s for _, s in ranked] == pytest.approx([scores[i] for i in best_first], abs=1e-5)


def test_trust_remote_code_is_off_by_default(tiny_models, tmp_path):
    """A model directory that ships its own tokenizer code: the engine serves it with the built-in class and the
    shipped code never runs."""
    model = tmp_path / "custom-code"
    shutil.copytree(tiny_models["bert-cls"], model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": ["custom.CustomTokenizer", None]})
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "custom.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('CODE_RAN').touch()\n"
        "from transformers import BertTokenizer\nclass CustomTokenizer(BertTokenizer):\n    pass\n"
    )
    with PoolingEngine(model, device="cpu", dtype="float32") as engine:
        assert engine.options.trust_remote_code is False
        assert engine.embed(["text"]).shape == (1, engine.dimension)
    assert not (model / "CODE_RAN").exists(), "the model's own code ran without trust_remote_code=True"
