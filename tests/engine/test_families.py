"""Every supported family against a plain-transformers reference (fp32, max abs diff <= 1e-4)."""

from __future__ import annotations

import functools
import json
import shutil

import numpy as np
import pytest
import reference
import torch
from corpus import mixed_length
from model_builders import build_embeddinggemma, build_modernbert, build_nomic

from rbln_retrieval import ModelNotSupportedError, PoolingEngine, detect_family
from rbln_retrieval.models.files import check_weights
from rbln_retrieval.models.specs.qwen3_embedding import QWEN3_DEFAULT_TASK

TEXTS = mixed_length(40)
QUERY = "How are exceptions raised and handled in Python?"
BI_ENCODERS = {"bert-cls": "CLS", "roberta-mean": "MEAN", "xlm-roberta-mean": "MEAN"}


def _engine(path) -> PoolingEngine:
    return PoolingEngine.shared(path, device="cpu", dtype="float32")


@pytest.mark.parametrize("name", list(BI_ENCODERS))
def test_bi_encoder_pooling_is_read_from_the_checkpoint(tiny_models, name):
    """Each bi-encoder layout's pooling, read from its sentence-transformers files. Its vectors and cosine scores
    against plain transformers are tests/backend/test_parity.py's, one engine per family at 1e-5."""
    assert detect_family(tiny_models[name]).pool.pooling == BI_ENCODERS[name]


def test_cross_encoder_reranks_by_its_scores_and_refuses_what_it_cannot_do(tiny_models):
    """Ranking and refusals are the family's, not the layout's: one cross-encoder (BERT); every cross-encoder
    layout's scores against plain transformers are tests/backend/test_parity.py's."""
    engine = _engine(tiny_models["bert-cross-encoder"])
    ours = engine.score(QUERY, TEXTS)
    top = engine.rerank(QUERY, TEXTS, top_n=3)
    assert [i for i, _ in top] == [i for i, _ in sorted(enumerate(ours), key=lambda p: -p[1])[:3]]
    assert [s for _, s in top] == pytest.approx(sorted(ours, reverse=True)[:3], abs=1e-6)
    with pytest.raises(ValueError, match="cannot embed"):
        engine.embed(["a"])
    with pytest.raises(ValueError, match="takes no instruction"):
        engine.score(QUERY, ["a"], instruction="Judge relevance")
    engine.close()


@pytest.fixture(scope="module")
def qwen3_embedding(tiny_models):
    engine = _engine(tiny_models["qwen3-embedding"])
    yield tiny_models["qwen3-embedding"], engine
    engine.close()


def test_qwen3_embedding_documents_are_plain_and_queries_carry_the_instruction(qwen3_embedding):
    path, engine = qwen3_embedding
    docs = engine.embed(TEXTS)
    assert np.abs(docs - reference.embed(str(path), TEXTS, pooling="LAST", max_length=512)).max() <= 1e-4
    queries = engine.embed([QUERY], kind="query")
    prefix = f"Instruct: {QWEN3_DEFAULT_TASK}\nQuery:"
    expected = reference.embed(str(path), [QUERY], pooling="LAST", max_length=512, prefix=prefix)
    assert np.abs(queries - expected).max() <= 1e-4
    assert np.abs(queries - engine.embed([QUERY])).max() > 1e-3, "a query must differ from the same text as document"
    custom = engine.embed([QUERY], kind="query", instruction="Find Python documentation")
    expected = reference.embed(
        str(path), [QUERY], pooling="LAST", max_length=512, prefix="Instruct: Find Python documentation\nQuery:"
    )
    assert np.abs(custom - expected).max() <= 1e-4


def test_qwen3_embedding_matryoshka_dimensions(qwen3_embedding):
    path, engine = qwen3_embedding
    small = engine.embed(TEXTS[:8], dimensions=16)
    assert small.shape == (8, 16)
    expected = reference.embed(str(path), TEXTS[:8], pooling="LAST", max_length=512, dimensions=16)
    assert np.abs(small - expected).max() <= 1e-4
    np.testing.assert_allclose(np.linalg.norm(small, axis=1), 1.0, atol=1e-5)
    assert engine.embed([], dimensions=16).shape == (0, 16)
    for bad in (0, -3, 65):
        with pytest.raises(ValueError, match="dimensions"):
            engine.embed(["a"], dimensions=bad)


def test_dimensions_on_a_model_without_matryoshka_is_rejected(minilm_engine):
    with pytest.raises(ValueError, match="does not support matryoshka"):
        minilm_engine.embed(["a"], dimensions=128)


def test_qwen3_reranker_is_p_yes_with_its_templates(tiny_models):
    path = tiny_models["qwen3-reranker"]
    engine = _engine(path)
    assert engine.family.name == "qwen3-reranker"
    ours = engine.score(QUERY, TEXTS)
    expected = reference.qwen3_reranker_scores(str(path), QUERY, TEXTS, instruction=QWEN3_DEFAULT_TASK, max_length=512)
    assert np.abs(np.array(ours) - expected).max() <= 1e-4
    custom = engine.score(QUERY, TEXTS[:5], instruction="Judge whether the text is about Python")
    expected = reference.qwen3_reranker_scores(
        str(path), QUERY, TEXTS[:5], instruction="Judge whether the text is about Python", max_length=512
    )
    assert np.abs(np.array(custom) - expected).max() <= 1e-4
    assert np.abs(np.array(custom) - ours[:5]).max() > 1e-6, "the instruction must reach the model"
    engine.close()


NOMIC_PROMPTS = {"query": "search_query: ", "document": "search_document: "}


def test_modernbert_detection_reads_pooling_prompts_and_length(tiny_models, tmp_path):
    """gte-modernbert-base's layout (CLS, no prompts), its reranker, and modernbert-embed-base's (mean pooling,
    prompts and a sequence limit below the position table's from the sentence-transformers files)."""
    gte = detect_family(tiny_models["modernbert-cls"])
    assert (gte.name, gte.graph.architecture, gte.pool.pooling, gte.output.normalize) == (
        "bi-encoder",
        "ModernBertModel",
        "CLS",
        True,
    )
    assert (
        gte.prompt.query_prompt,
        gte.prompt.document_prompt,
        gte.tokens.max_length,
        gte.tokens.uses_token_type_ids,
    ) == ("", "", 512, False)
    reranker = detect_family(tiny_models["modernbert-cross-encoder"])
    assert (reranker.name, reranker.graph.architecture) == ("cross-encoder", "ModernBertForSequenceClassification")
    assert not reranker.tokens.uses_token_type_ids
    nomic = detect_family(build_modernbert(tmp_path / "nomic", pooling="mean", prompts=NOMIC_PROMPTS, max_length=256))
    assert (nomic.pool.pooling, nomic.tokens.max_length) == ("MEAN", 256)
    assert (nomic.prompt.query_prompt, nomic.prompt.document_prompt) == ("search_query: ", "search_document: ")


def test_modernbert_prompts_reach_the_windowed_model(tmp_path):
    """Mean pooling and the checkpoint's prompts through the default engine; most texts outrun the local layers'
    window."""
    path = build_modernbert(tmp_path / "nomic", pooling="mean", prompts=NOMIC_PROMPTS)
    engine = _engine(path)
    documents = engine.embed(TEXTS)
    expected = reference.embed(str(path), TEXTS, pooling="MEAN", max_length=512, prefix="search_document: ")
    assert np.abs(documents - expected).max() <= 1e-4
    queries = engine.embed([QUERY], kind="query")
    expected = reference.embed(str(path), [QUERY], pooling="MEAN", max_length=512, prefix="search_query: ")
    assert np.abs(queries - expected).max() <= 1e-4
    assert np.abs(queries - engine.embed([QUERY])).max() > 1e-3, "a query must differ from the same text as document"
    engine.close()


# -- remote-code families: GTE-new and Nomic -------------------------------------------------------------------
def test_remote_code_families_are_detected_from_their_config(tiny_models):
    gte, nomic = detect_family(tiny_models["gte-new"]), detect_family(tiny_models["nomic"])
    assert (gte.name, gte.pool.pooling, gte.prompt.query_prompt, gte.prompt.document_prompt, gte.output.matryoshka) == (
        "gte-new",
        "CLS",
        "",
        "",
        False,
    )
    assert (
        gte.graph.hf_overrides == {"architectures": ["GteNewModel"]}
        and gte.graph.config_code == "configuration.NewConfig"
    )
    assert (
        nomic.name,
        nomic.pool.pooling,
        nomic.prompt.query_prompt,
        nomic.prompt.document_prompt,
        nomic.output.matryoshka,
    ) == (
        "nomic",
        "MEAN",
        "search_query: ",
        "search_document: ",
        True,
    )
    # GPT-2 field names: n_embd, n_positions.
    assert (nomic.pool.hidden_size, nomic.tokens.max_length, nomic.graph.hf_overrides) == (
        64,
        512,
        {"is_matryoshka": True},
    )


def test_nomic_uses_the_checkpoints_own_prompts(tmp_path):
    path = build_nomic(tmp_path / "nomic", prompts={"query": "query: ", "document": "passage: "})
    family = detect_family(path)
    assert (family.prompt.query_prompt, family.prompt.document_prompt) == ("query: ", "passage: ")


@pytest.mark.parametrize("name", ["gte-new", "nomic"])
def test_a_remote_code_family_without_trust_remote_code_is_one_sentence(tiny_models, name):
    path = tiny_models[name]
    with pytest.raises(ModelNotSupportedError) as raised:
        PoolingEngine(path, device="cpu", dtype="float32")
    message = str(raised.value)
    assert "\n" not in message and message.endswith("pass trust_remote_code=True if you trust its source.")
    assert message.startswith(f"{path} is a {detect_family(path).graph.architecture} checkpoint ({name})")


def test_a_remote_code_family_missing_its_config_code_is_one_sentence(tiny_models, tmp_path):
    shutil.copytree(tiny_models["gte-new"], tmp_path / "gte", ignore=shutil.ignore_patterns("configuration.py"))
    with pytest.raises(ModelNotSupportedError) as raised:
        PoolingEngine(tmp_path / "gte", device="cpu", dtype="float32", trust_remote_code=True)
    assert str(raised.value) == (
        f"{tmp_path / 'gte'} names its config class configuration.NewConfig, but configuration.py is not in the "
        "directory."
    )


@pytest.fixture(scope="module")
def nomic(tiny_models):
    engine = PoolingEngine.shared(tiny_models["nomic"], device="cpu", dtype="float32", trust_remote_code=True)
    yield tiny_models["nomic"], engine
    engine.close()


def test_nomic_prefixes_queries_and_documents_with_its_task_prefixes(nomic):
    path, engine = nomic
    docs, queries = engine.embed(TEXTS), engine.embed([QUERY], kind="query")
    expected = reference.embed(str(path), TEXTS, pooling="MEAN", max_length=512, prefix="search_document: ")
    assert np.abs(docs - expected).max() <= 1e-4
    expected = reference.embed(str(path), [QUERY], pooling="MEAN", max_length=512, prefix="search_query: ")
    assert np.abs(queries - expected).max() <= 1e-4
    assert np.abs(queries - engine.embed([QUERY])).max() > 1e-3, "a query must differ from the same text as document"
    custom = engine.embed([QUERY], kind="query", instruction="clustering: ")
    expected = reference.embed(str(path), [QUERY], pooling="MEAN", max_length=512, prefix="clustering: ")
    assert np.abs(custom - expected).max() <= 1e-4


def test_nomic_matryoshka_truncates_then_normalizes_as_vllm_does(nomic):
    """vLLM's order (sentence-transformers' too): pool, truncate, normalize; nomic's model card puts a layer_norm
    before the truncation, which callers apply to normalize=False vectors themselves (README)."""
    path, engine = nomic
    small = engine.embed(TEXTS[:8], dimensions=16)
    expected = reference.embed(
        str(path), TEXTS[:8], pooling="MEAN", max_length=512, prefix="search_document: ", dimensions=16
    )
    assert small.shape == (8, 16) and np.abs(small - expected).max() <= 1e-4
    raw = engine.embed(TEXTS[:8], normalize=False)
    unnormalized = reference.embed(
        str(path), TEXTS[:8], pooling="MEAN", max_length=512, prefix="search_document: ", normalize=False
    )
    assert np.abs(raw - unnormalized).max() <= 1e-4 * np.abs(unnormalized).max()
    with pytest.raises(ValueError, match="dimensions"):
        engine.embed(["a"], dimensions=65)


# -- EmbeddingGemma ----------------------------------------------------------------------------------------------


def _edit_json(path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**data, **changes}), encoding="utf-8")


def test_embeddinggemma_is_detected_with_its_prompts_pooling_and_sizes(tiny_models, tmp_path):
    family = detect_family(tiny_models["embeddinggemma"])
    assert (family.name, family.pool.pooling, family.output.normalize) == ("embeddinggemma", "MEAN", True)
    assert family.prompt.query_prompt == "task: search result | query: "
    assert family.prompt.document_prompt == "title: none | text: "
    assert family.pool.hidden_size == 64 and family.output.matryoshka_dimensions == (64, 32, 16, 8)
    # The model's own prompts win over the published ones, which apply only when it declares none.
    own = build_embeddinggemma(tmp_path / "own", prompts={"query": "Q: ", "document": "D: "})
    assert (detect_family(own).prompt.query_prompt, detect_family(own).prompt.document_prompt) == ("Q: ", "D: ")
    with pytest.raises(
        ModelNotSupportedError, match=r"is not an EmbeddingGemma checkpoint \(architecture 'BertModel'\)"
    ):
        detect_family(tiny_models["bert-cls"], family="embeddinggemma")
    _edit_json(own / "config_sentence_transformers.json", prompts={})
    assert detect_family(own).prompt.query_prompt == "task: search result | query: "
    assert detect_family(own).prompt.document_prompt == "title: none | text: "


def test_embeddinggemma_width_and_sizes_as_the_real_checkpoint_declares_them(tiny_models, tmp_path):
    """google/embeddinggemma-300m: hidden 768, Dense 768 -> 3072 -> 768, no matryoshka sizes in config.json (the
    model card's 768/512/256/128 apply); an output width of its own comes from the last Dense layer."""
    model = tmp_path / "real-layout"
    shutil.copytree(tiny_models["embeddinggemma"], model)
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    del config["matryoshka_dimensions"]
    (model / "config.json").write_text(json.dumps({**config, "hidden_size": 768}), encoding="utf-8")
    _edit_json(model / "2_Dense" / "config.json", in_features=768, out_features=3072)
    _edit_json(model / "3_Dense" / "config.json", in_features=3072, out_features=768)
    family = detect_family(model)
    assert family.pool.hidden_size == 768 and family.output.matryoshka_dimensions == (768, 512, 256, 128)
    assert family.graph.hf_overrides["matryoshka_dimensions"] == [768, 512, 256, 128]
    _edit_json(model / "3_Dense" / "config.json", out_features=256)
    assert detect_family(model).pool.hidden_size == 256 and detect_family(model).output.matryoshka_dimensions == (
        256,
        128,
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: _edit_json(m / "config.json", use_bidirectional_attention=False), "is a causal Gemma3 model"),
        (lambda m: _edit_json(m / "1_Pooling" / "config.json", include_prompt=False), "leaves the prompt out"),
        (
            lambda m: _edit_json(
                m / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True
            ),
            "uses none of the modes",
        ),
        (lambda m: (m / "3_Dense" / "model.safetensors").unlink(), "'3_Dense' lacks its config.json or its weights"),
        (
            lambda m: _edit_json(m / "2_Dense" / "config.json", activation_function="torch.nn.modules.activation.ELU"),
            "'2_Dense' uses activation torch.nn.modules.activation.ELU",
        ),
        (lambda m: _edit_json(m / "3_Dense" / "config.json", in_features=128), "'3_Dense' takes 128 features, not 256"),
        (lambda m: _edit_json(m / "config.json", matryoshka_dimensions=[64, 100]), r"not all within 1\.\.64"),
    ],
    ids=[
        "causal",
        "prompt-excluded",
        "max-pooling",
        "dense-without-weights",
        "dense-activation",
        "dense-shapes",
        "sizes",
    ],
)
def test_embeddinggemma_what_it_cannot_run_is_refused_in_one_sentence(tiny_models, tmp_path, edit, message):
    model = tmp_path / "model"
    shutil.copytree(tiny_models["embeddinggemma"], model)
    edit(model)
    with pytest.raises(ModelNotSupportedError, match=message) as caught:
        detect_family(model)
    assert str(caught.value).count(". ") == 0 and str(caught.value).endswith(".")


def test_embeddinggemma_pickle_dense_weights_need_allow_pickle(tiny_models, tmp_path):
    from safetensors.torch import load_file

    model = tmp_path / "model"
    shutil.copytree(tiny_models["embeddinggemma"], model)
    weights = model / "2_Dense" / "model.safetensors"
    torch.save(load_file(weights), model / "2_Dense" / "pytorch_model.bin")
    weights.unlink()
    assert detect_family(model).pool.hidden_size == 64
    with pytest.raises(ModelNotSupportedError, match="'2_Dense' has only pickle weights"):
        check_weights(model, allow_pickle=False)
    check_weights(model, allow_pickle=True)


@pytest.fixture(scope="module")
def embeddinggemma(tiny_models):
    engine = _engine(tiny_models["embeddinggemma"])
    yield tiny_models["embeddinggemma"], engine
    engine.close()


def test_embeddinggemma_queries_and_documents_carry_their_prompts(embeddinggemma):
    path, engine = embeddinggemma
    recipe = functools.partial(reference.embeddinggemma, str(path), max_length=512)
    docs = engine.embed(TEXTS)
    assert np.abs(docs - recipe(TEXTS, prefix="title: none | text: ")).max() <= 1e-4
    queries = engine.embed([QUERY, TEXTS[3]], kind="query")
    assert np.abs(queries - recipe([QUERY, TEXTS[3]], prefix="task: search result | query: ")).max() <= 1e-4
    assert np.abs(queries[1] - docs[3]).max() > 1e-3, "a query must differ from the same text as document"
    task = engine.embed([QUERY], kind="query", instruction="code retrieval")
    assert np.abs(task - recipe([QUERY], prefix="task: code retrieval | query: ")).max() <= 1e-4
    scores = engine.score(QUERY, TEXTS[:5])
    assert scores == pytest.approx(list(docs[:5] @ queries[0]), abs=1e-5)


def test_embeddinggemma_matryoshka_truncates_after_the_dense_projection(embeddinggemma):
    """sentence-transformers' order: Dense layers, then truncation, then normalization."""
    path, engine = embeddinggemma
    for size in (32, 16, 8):
        small = engine.embed(TEXTS[:8], dimensions=size)
        expected = reference.embeddinggemma(
            str(path), TEXTS[:8], prefix="title: none | text: ", max_length=512, dimensions=size
        )
        assert small.shape == (8, size) and np.abs(small - expected).max() <= 1e-4
        np.testing.assert_allclose(np.linalg.norm(small, axis=1), 1.0, atol=1e-5)
    query = engine.embed([QUERY], kind="query", dimensions=16)
    expected = reference.embeddinggemma(
        str(path), [QUERY], prefix="task: search result | query: ", max_length=512, dimensions=16
    )
    assert np.abs(query - expected).max() <= 1e-4
    with pytest.raises(
        ValueError, match=r"^dimensions=48 is not one of the sizes .* was trained for \(64, 32, 16, 8\)\.$"
    ):
        engine.embed(["a"], dimensions=48)
    for bad in (0, 65):
        with pytest.raises(ValueError, match=f"dimensions={bad} is not one of the sizes"):
            engine.embed(["a"], dimensions=bad)
    with pytest.raises(TypeError, match="dimensions is float"):
        engine.embed(["a"], dimensions=16.0)


def test_colbert_gives_token_vectors_and_ranks_by_summed_maxsim(tiny_models):
    """An HF_ColBERT checkpoint: token vectors of the projection's width like the plain-torch reference, scores
    and rankings by MaxSim without asking for it, and one sentence for the outputs it has no head for."""
    path = tiny_models["colbert"]
    engine = _engine(path)
    assert (engine.family.name, engine.dimension) == ("colbert", 32)
    ours = engine.embed(TEXTS[:8], output="multi_vector")
    expected = reference.colbert(str(path), TEXTS[:8], max_length=512)
    assert [v.shape for v in ours] == [e.shape for e in expected]
    assert max(np.abs(a - b).max() for a, b in zip(ours, expected)) <= 1e-4
    (query,) = reference.colbert(str(path), [QUERY], max_length=512)
    want = [reference.colbert_maxsim(query, d) for d in expected]
    assert engine.score(QUERY, TEXTS[:8]) == pytest.approx(want, abs=1e-4)
    assert engine.score(QUERY, TEXTS[:8], output="multi_vector") == engine.score(QUERY, TEXTS[:8])
    assert [i for i, _ in engine.rerank(QUERY, TEXTS[:8], top_n=3)] == sorted(range(8), key=lambda i: -want[i])[:3]
    assert engine.score(QUERY, []) == []
    for output in ("dense", "sparse"):
        with pytest.raises(ValueError, match=rf"is a ColBERT model with no .* so it cannot give output='{output}'"):
            engine.embed(["a"], output=output)
    with pytest.raises(ValueError, match="cannot give output='dense'"):
        engine.embed(["a"])
    engine.close()


def test_colbert_checkpoints_vllm_cannot_run_as_colbert_are_refused_at_detection(tiny_models, tmp_path):
    """An HF_ColBERT directory without its projection, and a PyLate checkpoint (Dense module, [Q]/[D] prefixes,
    which a bi-encoder preset would silently mis-pool), each get one sentence."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from rbln_retrieval import ModelNotSupportedError, detect_family

    headless = tmp_path / "headless"
    shutil.copytree(tiny_models["colbert"], headless)
    weights = load_file(headless / "model.safetensors")
    del weights["linear.weight"]
    save_file(weights, headless / "model.safetensors")
    with pytest.raises(
        ModelNotSupportedError, match=r"HF_ColBERT checkpoint without its projection: no 'linear\.weight'"
    ):
        detect_family(headless)
    pylate = tmp_path / "pylate"
    shutil.copytree(tiny_models["bert-cls"], pylate)
    (pylate / "config_sentence_transformers.json").write_text(
        json.dumps({"query_prefix": "[Q] ", "document_prefix": "[D] ", "prompts": {}}), encoding="utf-8"
    )
    with pytest.raises(ModelNotSupportedError, match=r"is a PyLate ColBERT checkpoint .* does not support"):
        detect_family(pylate)


def test_a_bi_encoder_with_dense_layers_reports_their_width(tiny_models, tmp_path):
    """vLLM's embedding head applies any sentence-transformers Dense layers (LaBSE-style checkpoints): the family's
    width is theirs, and a Dense layer vLLM would skip is refused instead of silently changing the vectors."""
    model = tmp_path / "dense"
    shutil.copytree(tiny_models["bert-cls"], model)
    modules = json.loads((model / "modules.json").read_text(encoding="utf-8"))
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (model / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (model / "2_Dense").mkdir()
    dense = {
        "in_features": 64,
        "out_features": 16,
        "bias": True,
        "activation_function": "torch.nn.modules.activation.Tanh",
    }
    (model / "2_Dense" / "config.json").write_text(json.dumps(dense), encoding="utf-8")
    (model / "2_Dense" / "model.safetensors").write_bytes((tiny_models["bert-cls"] / "model.safetensors").read_bytes())
    assert detect_family(model).pool.hidden_size == 16
    _edit_json(model / "2_Dense" / "config.json", activation_function="torch.nn.modules.activation.ReLU")
    with pytest.raises(ModelNotSupportedError, match=r"'2_Dense' uses activation .*ReLU; only Identity and Tanh run\."):
        detect_family(model)
