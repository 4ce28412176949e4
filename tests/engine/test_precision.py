"""precision= on embed: quantized vectors equal to sentence-transformers' quantize_embeddings on the same float32
vectors, bit for bit and dtype for dtype, locally, over the CLI, in the framework classes and through a server."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from corpus import passages
from sentence_transformers.util.quantization import quantize_embeddings as st_quantize

from rbln_retrieval import quantization_ranges, quantize_embeddings

TEXTS = passages(min_words=5)[:40]
QUERIES = ["How do I open a file?", "What does the with statement do?", "integer division"]
PRECISIONS = ["float32", "int8", "uint8", "binary", "ubinary"]


@pytest.fixture(scope="module")
def calibration(minilm_engine) -> np.ndarray:
    return minilm_engine.embed(passages(min_words=5)[40:240])


def _st(vectors, precision, calibration):
    ranges = quantization_ranges(calibration) if precision.endswith("int8") else None
    return st_quantize(vectors, precision, ranges=ranges)


def _kwargs(precision, calibration, how="ranges"):
    if not precision.endswith("int8"):
        return {"precision": precision}
    if how == "ranges":
        return {"precision": precision, "ranges": quantization_ranges(calibration)}
    return {"precision": precision, "calibration_embeddings": calibration}


def _assert_same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def _codes(quantized, precision):
    """The per-dimension code of each value: the byte itself for int8/uint8, the bit for binary/ubinary."""
    if precision in ("binary", "ubinary"):
        as_bytes = (quantized.astype(np.int16) + (128 if precision == "binary" else 0)).astype(np.uint8)
        return np.unpackbits(as_bytes, axis=-1)
    return quantized.astype(np.int16)


def _assert_codes_of(got, floats, precision, calibration, atol=1e-5):
    """`got` is sentence-transformers' quantization of vectors within `atol` of `floats`: the floats of another call
    (another batch, so another GEMM blocking) may differ by ulps, which moves a value lying on a bucket edge or on zero
    into the next code, and nothing else."""
    want = _st(floats, precision, calibration)
    assert got.dtype == want.dtype and got.shape == want.shape
    low = _codes(_st(floats - atol, precision, calibration), precision)
    high = _codes(_st(floats + atol, precision, calibration), precision)
    codes = _codes(got, precision)
    assert np.all((low <= codes) & (codes <= high)), precision
    assert np.mean(codes == _codes(want, precision)) > 0.999, precision


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantize_embeddings_equals_sentence_transformers(precision):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((50, 37)).astype(np.float32)  # 37: a last byte only partly filled with bits
    calibration = rng.standard_normal((300, 37)).astype(np.float32) * 1.5
    calibration[:, 3] = 0.25  # a constant dimension (zero-width range)
    want = _st(vectors, precision, calibration)
    kw = {"calibration_embeddings": calibration} if precision.endswith("int8") else {}
    _assert_same(quantize_embeddings(vectors, precision, **kw), want)
    if precision.endswith("int8"):
        with_ranges = quantize_embeddings(vectors, precision, ranges=quantization_ranges(calibration))
        _assert_same(with_ranges, want)
        assert len(np.unique(want)) > 100  # the buckets are really spread, not all clipped


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("how", ["ranges", "calibration"])
def test_engine_embed_equals_sentence_transformers(minilm_engine, calibration, precision, how):
    if how == "calibration" and not precision.endswith("int8"):
        pytest.skip("calibration applies to int8/uint8 only")
    floats = minilm_engine.embed(TEXTS)
    got = minilm_engine.embed(TEXTS, **_kwargs(precision, calibration, how))
    _assert_same(got, _st(floats, precision, calibration))
    if precision != "float32":
        assert got.nbytes <= floats.nbytes // 4


def test_aembed_and_queries_and_dimensions(minilm_engine, calibration):
    ranges = quantization_ranges(calibration)
    got = asyncio.run(minilm_engine.aembed(QUERIES, kind="query", precision="int8", ranges=ranges))
    _assert_same(got, _st(minilm_engine.embed(QUERIES, kind="query"), "int8", calibration))
    _assert_same(minilm_engine.embed([], precision="binary"), np.zeros((0, 48), dtype=np.int8))


def test_binary_bits_are_the_signs(minilm_engine):
    floats = minilm_engine.embed(TEXTS[:5])
    bits = np.unpackbits(minilm_engine.embed(TEXTS[:5], precision="ubinary"), axis=-1)
    np.testing.assert_array_equal(bits, (floats > 0).astype(np.uint8))
    signed = minilm_engine.embed(TEXTS[:5], precision="binary")
    np.testing.assert_array_equal(signed.view(np.uint8) ^ 0x80, np.packbits(floats > 0, axis=-1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "int4"}, "precision must be one of float32, int8, uint8, binary, ubinary, not 'int4'"),
        ({"precision": "int8"}, "precision='int8' needs ranges"),
        ({"precision": "uint8"}, "precision='uint8' needs ranges"),
        ({"precision": "int8", "ranges": np.zeros((2, 383))}, r"ranges must have shape \(2, 384\).*\(2, 383\)"),
        ({"precision": "int8", "ranges": np.zeros((384,))}, r"ranges must have shape \(2, 384\).*\(384,\)"),
        ({"precision": "uint8", "calibration_embeddings": np.zeros((5, 10))}, r"calibration_embeddings' ranges"),
        ({"precision": "int8", "calibration_embeddings": np.zeros((0, 384))}, "non-empty float array"),
        ({"precision": "binary", "ranges": np.zeros((2, 384))}, "apply to int8 and uint8 only, not to 'binary'"),
        ({"precision": "binary", "output": "sparse"}, "applies to dense vectors only, not output='sparse'"),
        ({"precision": "ubinary", "output": "multi_vector"}, "not output='multi_vector'"),
        (
            {"precision": "int8", "ranges": np.zeros((2, 384)), "calibration_embeddings": np.zeros((3, 384))},
            "not both",
        ),
    ],
)
def test_bad_precision_arguments_are_refused_in_one_sentence(minilm_engine, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        minilm_engine.embed(["a text"], **kwargs)
    assert str(info.value).count(". ") == 0 and str(info.value).endswith(".")


def test_cli_embed_precision(minilm, calibration, tmp_path):
    from rbln_retrieval.cli import main

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[:6]) + "\n")
    np.save(tmp_path / "ranges.npy", quantization_ranges(calibration))
    common = [
        "embed",
        "--model",
        str(minilm),
        str(texts),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-progress",
    ]
    assert main([*common, "-o", str(tmp_path / "f.npy")]) == 0
    assert (
        main([*common, "-o", str(tmp_path / "q.npy"), "--precision", "uint8", "--ranges", str(tmp_path / "ranges.npy")])
        == 0
    )
    _assert_same(np.load(tmp_path / "q.npy"), _st(np.load(tmp_path / "f.npy"), "uint8", calibration))
    assert main([*common, "-o", str(tmp_path / "b.npy"), "--precision", "binary"]) == 0
    _assert_same(np.load(tmp_path / "b.npy"), _st(np.load(tmp_path / "f.npy"), "binary", calibration))


def test_cli_refuses_int8_without_ranges_before_starting(minilm, tmp_path, capsys):
    from rbln_retrieval.cli import main

    (tmp_path / "t.txt").write_text("a\n")
    assert main(["embed", "-m", str(minilm), str(tmp_path / "t.txt"), "--precision", "int8"]) == 1
    assert "--precision int8 needs either --ranges or --calibration" in capsys.readouterr().err


def test_langchain_and_llama_index_int8(minilm, minilm_engine, calibration):
    from langchain_rbln import RBLNEmbeddings
    from llama_index.embeddings.rbln import RBLNEmbedding

    ranges = quantization_ranges(calibration).tolist()
    want_docs = _st(minilm_engine.embed(TEXTS[:4]), "int8", calibration).tolist()
    want_query = _st(minilm_engine.embed(QUERIES[:1], kind="query"), "int8", calibration)[0].tolist()
    options = {"device": "cpu", "dtype": "float32", "precision": "int8", "quantization_ranges": ranges}
    with RBLNEmbeddings(model=str(minilm), **options) as lc:
        assert lc.embed_documents(TEXTS[:4]) == want_docs
        assert lc.embed_query(QUERIES[0]) == want_query
    li = RBLNEmbedding(model_name=str(minilm), **options)
    assert li.get_text_embedding_batch(TEXTS[:4]) == want_docs
    assert li.get_query_embedding(QUERIES[0]) == want_query
    with pytest.raises(ValueError, match="precision"):
        RBLNEmbeddings(model=str(minilm), device="cpu", dtype="float32", precision="binary")


@pytest.mark.server
def test_remote_sends_quantized_bytes_equal_to_local(minilm_server, minilm, minilm_engine, calibration):
    import httpx

    from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH
    from rbln_retrieval.remote import RemoteEngine

    ranges = quantization_ranges(calibration)
    with RemoteEngine(str(minilm), base_url=minilm_server.url) as remote:
        remote_floats = remote.embed(TEXTS)
        # Each call is another batch on the server, so its floats may differ from remote_floats by ulps: the codes
        # are sentence-transformers' of floats that close, and agree with the local engine's.
        for precision in PRECISIONS[1:]:
            kw = _kwargs(precision, calibration)
            got = remote.embed(TEXTS, **kw)
            _assert_codes_of(got, remote_floats, precision, calibration)
            local = minilm_engine.embed(TEXTS, **kw)
            assert np.mean(got == local) > 0.99, precision
        assert remote._remote.quantizes
        got = asyncio.run(remote.aembed(QUERIES, kind="query", precision="uint8", calibration_embeddings=calibration))
        _assert_codes_of(got, remote.embed(QUERIES, kind="query"), "uint8", calibration)
        # A plain vLLM server has no quantized route: the client then quantizes the float32 answer itself.
        remote._remote.quantizes = False
        _assert_codes_of(remote.embed(TEXTS, precision="binary"), remote_floats, "binary", calibration)
        with pytest.raises(ValueError, match=r"ranges must have shape \(2, 384\)"):
            remote.embed(TEXTS, precision="int8", ranges=ranges[:, :10])
        with pytest.raises(ValueError, match="precision must be one of"):
            remote.embed(TEXTS, precision="fp4")
    # On the wire: base64 of one byte per dimension (int8), one bit per dimension (binary), never floats.
    body = {"model": str(minilm), "input": TEXTS[:2], "precision": "binary"}
    answer = httpx.post(minilm_server.url + QUANTIZED_EMBED_PATH, json=body, timeout=60).json()
    assert answer["dtype"] == "int8" and len(base64.b64decode(answer["data"][0]["embedding"])) == 384 // 8
    body = {**body, "precision": "int8", "ranges": ranges[:, :10].tolist()}
    refused = httpx.post(minilm_server.url + QUANTIZED_EMBED_PATH, json=body, timeout=60)
    assert refused.status_code == 400 and "ranges must have shape (2, 384)" in refused.json()["error"]["message"]
