"""The four framework classes as a production app uses them: shared engines with lifetimes, fork and spawn
workers, pickling, fields assigned after construction, core errors with their own types, light imports, invalid
Unicode and mappings."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import traceback
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import llama_index.core
import numpy as np
import pytest
from forking import run_in_child
from http_fakes import FakeServer
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from model_builders import HUB_MINILM, HUB_TINY_RERANKER
from pydantic import ValidationError

import rbln_retrieval.frameworks.settings
from langchain_rbln import RBLNEmbeddings, RBLNReranker
from llama_index.embeddings.rbln import RBLNEmbedding, RBLNSparseEmbedding
from llama_index.postprocessor.rbln_rerank import RBLNReranker as NodeReranker
from rbln_retrieval import ModelNotFoundError, ModelNotSupportedError, PoolingEngine
from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.models import families
from rbln_retrieval.remote import RemoteError

QUERY = "Which planet looks red?"
TEXTS = ["Mars looks red.", "Jupiter is big.", "Venus is hot."]


def test_closing_one_object_never_affects_another(minilm, minilm_engine, cpu):
    a, b = RBLNEmbeddings(model=minilm, **cpu), RBLNEmbedding(model_name=minilm, **cpu)
    reranker = RBLNReranker(model=minilm, truncate="start", **cpu)  # truncate is per call: the same engine
    assert a.engine.engine is b._engine.engine is reranker.engine.engine is minilm_engine.engine
    a.engine.close()  # what the README used to suggest: releases a's claim only
    a.close()
    b.close()
    assert reranker.rerank(TEXTS, QUERY, top_n=1)[0]["index"] == 0
    with RBLNEmbeddings(model=minilm, **cpu) as scoped:
        assert len(scoped.embed_query(QUERY)) == 384
    with NodeReranker(model=str(minilm), **cpu) as scoped_nodes:
        assert (
            scoped_nodes.postprocess_nodes(
                [NodeWithScore(node=TextNode(text=t)) for t in TEXTS], query_bundle=QueryBundle(QUERY)
            )[0].node.text
            == TEXTS[0]
        )
    assert minilm_engine.embed(["x"]).shape == (1, 384)


def _objects(minilm, cpu):
    return [
        RBLNEmbeddings(model=minilm, **cpu),
        RBLNReranker(model=minilm, top_n=None, **cpu),
        RBLNEmbedding(model_name=minilm, **cpu),
        NodeReranker(model=str(minilm), top_n=None, **cpu),
    ]


def _use(obj):
    if isinstance(obj, RBLNEmbeddings):
        return obj.embed_query(QUERY)
    if isinstance(obj, RBLNEmbedding):
        return obj.get_query_embedding(QUERY)
    if isinstance(obj, RBLNReranker):
        return [
            d.metadata["relevance_score"]
            for d in obj.compress_documents([Document(page_content=t) for t in TEXTS], QUERY)
        ]
    return [
        n.score
        for n in obj.postprocess_nodes(
            [NodeWithScore(node=TextNode(text=t)) for t in TEXTS], query_bundle=QueryBundle(QUERY)
        )
    ]


def test_objects_pickle_and_reattach_on_first_use(minilm, cpu):
    for obj in _objects(minilm, cpu):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy._engine.engine is obj._engine.engine, type(obj).__name__
        np.testing.assert_allclose(_use(copy), _use(obj), atol=1e-6)


def _use_all(objects):
    return [_use(obj) for obj in objects]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_objects_work_in_fork_and_spawn_workers(minilm, method, cpu):
    objects = _objects(minilm, cpu)
    expected = _use_all(objects)
    result = run_in_child(method, _use_all, objects, deadline=600)
    assert result[0] == "ok", result
    for got, want in zip(result[1], expected):
        np.testing.assert_allclose(got, want, atol=1e-5)


def _run_pipeline(embedding, documents, num_workers):
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter

    transformations = [SentenceSplitter(), embedding]
    nodes = IngestionPipeline(transformations=transformations, disable_cache=True).run(
        documents=documents, num_workers=num_workers
    )  # a spawn Pool: each worker unpickles the transformations
    return [(node.get_content(), node.embedding) for node in nodes]


def test_ingestion_pipeline_with_worker_processes(minilm, monkeypatch, cpu):
    from llama_index.core import Document as LlamaDocument

    # A spawn worker unpickling SentenceSplitter reloads tiktoken's encoding, which downloads it unless this names
    # LlamaIndex's bundled copy; offline, the download's OSError makes multiprocessing.Pool drop the worker and its
    # task without a word, and run() waits forever (RBLNEmbedding itself starts an in-process engine per worker).
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(Path(llama_index.core.__file__).parent / "_static/tiktoken_cache"))
    embedding = RBLNEmbedding(model_name=minilm, **cpu)
    documents = [LlamaDocument(text=t, id_=f"doc-{i}") for i, t in enumerate(TEXTS * 2)]
    # In a child under a deadline (the pipeline's Pool needs a non-daemonic parent), so a hang fails the test.
    result = run_in_child("spawn", _run_pipeline, embedding, documents, 2, deadline=600)
    assert result[0] == "ok", result
    assert sorted(text for text, _ in result[1]) == sorted(TEXTS * 2)
    for text, vector in result[1]:
        np.testing.assert_allclose(vector, embedding.get_text_embedding(text), atol=1e-5)


async def test_async_ingestion_pipeline_with_forked_workers(minilm, cpu):
    from llama_index.core import Document as LlamaDocument
    from llama_index.core.ingestion import IngestionPipeline

    embedding = RBLNEmbedding(model_name=minilm, **cpu)
    embedding.get_text_embedding("started")  # the parent's engine runs when the workers fork
    documents = [LlamaDocument(text=t, id_=f"doc-{i}") for i, t in enumerate(TEXTS * 2)]
    nodes = await IngestionPipeline(transformations=[embedding], disable_cache=True).arun(
        documents=documents, num_workers=2
    )  # a ProcessPoolExecutor: fork children on Linux
    assert len(nodes) == len(documents)
    for node in nodes:
        np.testing.assert_allclose(node.embedding, embedding.get_text_embedding(node.get_content()), atol=1e-5)


def test_per_call_fields_take_effect_when_assigned(minilm, cpu):
    long_text = " ".join(f"w{i}" for i in range(400))
    for obj, call in [
        (RBLNEmbeddings(model=minilm, **cpu), lambda o: o.embed_documents([long_text])),
        (RBLNEmbedding(model_name=minilm, **cpu), lambda o: o.get_text_embedding(long_text)),
    ]:
        call(obj)
        obj.truncate = "error"
        with pytest.raises(ValueError, match=r"over max_length=256 \(truncate='error'"):
            call(obj)


def test_remote_timeout_takes_effect_when_assigned(minilm):
    with FakeServer("sleep", delay=5) as slow:
        embedding = RBLNEmbedding(model_name=minilm, base_url=slow.url, timeout=60)
        embedding.timeout = 0.3
        with pytest.raises(RemoteError, match=r"timeout of 0\.3 s"):  # the whole call's, from its start
            embedding.get_text_embedding("x")


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda m, options: RBLNEmbeddings(model=m, **options), "model"),
        (lambda m, options: RBLNReranker(model=m, **options), "dtype"),
        (lambda m, options: RBLNEmbedding(model_name=m, **options), "device"),
        (lambda m, options: NodeReranker(model=str(m), **options), "base_url"),
    ],
)
def test_engine_fields_cannot_change_after_construction(minilm, make, field, cpu):
    obj = make(minilm, cpu)
    with pytest.raises(ValueError, match=f"{field} selects the engine of this .* cannot change after construction"):
        setattr(obj, field, "bfloat16" if field == "dtype" else "cpu")


@pytest.mark.parametrize(
    "make",
    [
        lambda p: RBLNEmbeddings(model=p),
        lambda p: RBLNReranker(model=p),
        lambda p: RBLNEmbedding(model_name=p),
        lambda p: NodeReranker(model=p),
    ],
)
def test_core_errors_keep_their_type(tmp_path, make):
    with pytest.raises(ModelNotSupportedError, match="does not exist") as raised:
        make(str(tmp_path / "missing"))
    assert not isinstance(raised.value, ValidationError)


def test_family_trust_remote_code_and_allow_pickle_pass_through(tmp_path, cpu):
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"], "max_position_embeddings": 64}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    for make in (
        lambda **kw: RBLNEmbeddings(model=tmp_path, **kw),
        lambda **kw: NodeReranker(model=str(tmp_path), **kw),
    ):
        with pytest.raises(ModelNotSupportedError, match="allow_pickle=True"):
            make(**cpu)
        # With allow_pickle the weights check passes and the start fails on the fake file instead.
        with pytest.raises(Exception) as raised:
            make(allow_pickle=True, trust_remote_code=True, family="bi-encoder", **cpu)
        assert "allow_pickle=True" not in str(raised.value)
    assert (
        RBLNEmbedding(
            model_name="served", base_url="http://127.0.0.1:9", family="qwen3-embedding"
        )._engine.spec.options.family
        == "qwen3-embedding"
    )


MAKERS = {
    "langchain-embeddings": lambda model, **kw: RBLNEmbeddings(model=model, **kw),
    "langchain-reranker": lambda model, **kw: RBLNReranker(model=model, **kw),
    "llama-index-embedding": lambda model, **kw: RBLNEmbedding(model_name=model, **kw),
    "llama-index-reranker": lambda model, **kw: NodeReranker(model=model, **kw),
}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS)
def test_every_engine_field_reaches_get_engine(monkeypatch, make):
    """Only the pass-through, the same for every framework class: each engine field as given, the others at their
    defaults, the API key from the environment unless given (the remote client and the engine are rbln_retrieval's,
    tested there)."""
    calls = []

    class Handle:
        engine = None
        spec = SimpleNamespace(family=None)  # a remote model's: its server names the family

    def recording_get_engine(model, **kwargs):
        calls.append((model, kwargs))
        return Handle()

    monkeypatch.setattr(rbln_retrieval.frameworks.settings, "get_engine", recording_get_engine)
    monkeypatch.setenv("RBLN_API_KEY", "from-env")
    given = dict(max_length=128, truncate="error", engine_kwargs={"max_num_seqs": 8}, dtype="bfloat16")
    source = dict(revision="v2", cache_folder="/hf-cache")
    make("served-model", base_url="http://127.0.0.1:9/", timeout=5.0, hf_token="hf-token", **given, **source)
    make("served-model", base_url=["http://a", "http://b"], api_key="explicit")
    defaults = dict(device="auto", family=None, trust_remote_code=False, allow_pickle=False, attach=False)
    assert calls == [
        (
            "served-model",
            dict(base_url="http://127.0.0.1:9/", api_key="from-env", token="hf-token", **given, **source, **defaults),
        ),
        (
            "served-model",
            dict(
                base_url=["http://a", "http://b"],
                api_key="explicit",
                token=None,
                revision=None,
                cache_folder=None,
                max_length=None,
                truncate="end",
                engine_kwargs={},
                dtype="auto",
                **defaults,
            ),
        ),
    ]


def test_a_hugging_face_id_works_like_its_directory_in_every_class_and_the_token_never_shows(
    hub_cache, minilm_engine, caplog, cpu
):
    """Ids resolve offline from a Hugging Face cache, every spelling of one snapshot and every class on one engine,
    with the directory's results; a revision or an id the cache lacks, or a reranker's id for an embedding class,
    is one sentence; the hub token is a SecretStr that reaches no repr, log or error."""
    caplog.set_level(logging.DEBUG)
    token = "hf_framework_secret_4b7e"
    source = {"cache_folder": str(hub_cache), "hf_token": token, **cpu}
    embeddings = RBLNEmbeddings(model=f"{HUB_MINILM}@main", **source)
    reranker = RBLNReranker(model=HUB_MINILM, revision="main", top_n=None, **source)
    embedding = RBLNEmbedding(model_name=f"{HUB_MINILM}@main", **source)
    node_reranker = NodeReranker(model=HUB_MINILM, revision="main", top_n=None, **source)
    objects = [embeddings, reranker, embedding, node_reranker]
    with PoolingEngine.shared(HUB_MINILM, cache_folder=hub_cache, **cpu) as by_id:
        handles = [embeddings.engine, reranker.engine, embedding._engine, node_reranker._engine]
        assert all(handle.engine is by_id.engine for handle in handles)
        expected = minilm_engine.embed(TEXTS)
        np.testing.assert_allclose(embeddings.embed_documents(TEXTS), expected, atol=1e-5)
        np.testing.assert_allclose(embedding.get_text_embedding_batch(TEXTS), expected, atol=1e-5)
        scores = minilm_engine.score(QUERY, TEXTS)
        best_first = sorted(range(len(TEXTS)), key=lambda i: -scores[i])
        ranked = reranker.rerank(TEXTS, QUERY)
        assert [r["index"] for r in ranked] == best_first
        assert [r["relevance_score"] for r in ranked] == pytest.approx([scores[i] for i in best_first], abs=1e-5)
        nodes = node_reranker.postprocess_nodes([NodeWithScore(node=TextNode(text=t)) for t in TEXTS], query_str=QUERY)
        assert [n.node.text for n in nodes] == [TEXTS[i] for i in best_first]
        assert [n.score for n in nodes] == pytest.approx([scores[i] for i in best_first], abs=1e-5)
    errors = []
    with pytest.raises(ValueError) as raised:
        RBLNEmbeddings(model=HUB_MINILM, revision="v9", **source)
    assert f"Revision 'v9' of {HUB_MINILM} is not in the Hugging Face cache" in str(raised.value)
    errors.append(raised.value)
    with pytest.raises(ValueError, match="is a reranker"):  # found from the id's configs, before any engine
        RBLNEmbedding(model_name=HUB_TINY_RERANKER, **source)
    with pytest.raises(ModelNotFoundError, match="no-such-org/model is not in the Hugging Face cache") as missing:
        RBLNEmbedding(model_name="no-such-org/model", **source)
    errors.append(missing.value)
    dumps = [embeddings.model_dump_json(), reranker.model_dump_json(), embedding.to_json(), node_reranker.to_json()]
    shown = [*map(repr, objects), *map(str, objects), *dumps, *("".join(traceback.format_exception(e)) for e in errors)]
    assert all(token not in text for text in [*shown, caplog.text])
    for framework_object in objects:
        framework_object.close()


def test_invalid_unicode_and_mappings_in_the_frameworks(minilm, minilm_engine, cpu):
    bad, replaced = "caf\udcff", "caf\ufffd"
    expected = minilm_engine.embed([replaced])[0]
    lc, li = RBLNEmbeddings(model=minilm, **cpu), RBLNEmbedding(model_name=minilm, **cpu)
    np.testing.assert_allclose(lc.embed_documents([bad])[0], expected, atol=1e-6)
    np.testing.assert_allclose(li.get_text_embedding_batch([bad])[0], expected, atol=1e-6)
    assert RBLNReranker(model=minilm, **cpu).rerank([bad], bad)[0]["relevance_score"] == pytest.approx(
        minilm_engine.score(replaced, [replaced])[0], abs=1e-6
    )
    with pytest.raises(TypeError, match="not a dict"):
        lc.embed_documents({"a": "Mars"})
    with pytest.raises(TypeError, match="not a dict"):
        li.get_text_embedding_batch({"a": "Mars"})
    with pytest.raises(TypeError, match="not a dict"):
        RBLNReranker(model=minilm, **cpu).rerank({"a": "Mars"}, QUERY)


HEAVY = ("torch", "transformers", "vllm")


def test_imports_and_remote_clients_load_no_torch_transformers_or_vllm():
    code = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "import langchain_rbln, llama_index.embeddings.rbln, llama_index.postprocessor.rbln_rerank\n"
        "from langchain_rbln import RBLNEmbeddings\n"
        "from llama_index.embeddings.rbln import RBLNEmbedding\n"
        "RBLNEmbeddings(model='served', base_url='http://127.0.0.1:9')\n"
        "RBLNEmbedding(model_name='served', base_url='http://127.0.0.1:9')\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules), round(time.perf_counter() - t, 2))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded, seconds = out.rsplit(" ", 1)
    print(f"import of both integrations and two remote clients: {seconds} s")
    assert loaded == "[]", f"imported {loaded}"


def test_framework_objects_take_truncate_chunk(minilm, minilm_engine, cpu):
    from rbln_retrieval import Chunk

    long = " ".join(f"w{i}" for i in range(600))  # over MiniLM's 256 tokens: several windows
    want = minilm_engine.embed(["short", long], truncate=Chunk(overlap=8))
    embeddings = RBLNEmbeddings(model=minilm, truncate=Chunk(overlap=8), **cpu)
    np.testing.assert_allclose(embeddings.embed_documents(["short", long]), want, atol=1e-5)
    embedding = RBLNEmbedding(model_name=minilm, truncate={"overlap": 8}, **cpu)
    np.testing.assert_allclose(embedding.get_text_embedding(long), want[1], atol=1e-5)
    with pytest.raises(ValidationError, match=r"Chunk\(output='all'\) gives every window's vector"):
        RBLNEmbeddings(model=minilm, truncate=Chunk(output="all"), **cpu)


def test_each_object_builds_its_engine_options_once_and_reads_its_family_once(minilm, minilm_engine, cpu, monkeypatch):
    """get_engine, the framework objects' entry, builds the EngineOptions and reads the family once and hands both
    down: the integrations check the family get_engine read, the engine takes the LocalModel it made."""
    counts: Counter[str] = Counter()
    build = EngineOptions.__init__
    read = families.Checkpoint  # what detect_family reads a directory through, once per detection

    def counted_build(self: EngineOptions, **data: object) -> None:
        counts["EngineOptions"] += 1
        build(self, **data)

    def counted_read(*args: object) -> object:
        counts["detect_family"] += 1
        return read(*args)

    monkeypatch.setattr(EngineOptions, "__init__", counted_build)
    monkeypatch.setattr(families, "Checkpoint", counted_read)
    for name, make in {**MAKERS, "llama-index-sparse": None}.items():
        if make is None:  # the sparse class refuses MiniLM (no sparse head) after the same one reading
            with pytest.raises(ValueError, match="sparse"):
                RBLNSparseEmbedding(model_name=str(minilm), **cpu)
        else:
            make(str(minilm), **cpu).close()
        assert counts == {"EngineOptions": 1, "detect_family": 1}, name
        counts.clear()
