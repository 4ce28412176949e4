"""Models by Hugging Face id: resolution through a cache laid out as huggingface_hub writes it (no hub here:
HF_HUB_OFFLINE=1), the errors of an id that cannot be resolved, and one engine shared by every spelling."""

from __future__ import annotations

import json
import logging
import traceback

import httpx2
import huggingface_hub
import numpy as np
import pytest
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import filter_repo_objects
from model_builders import HUB_MINILM, HUB_TINY, hub_cache_snapshot

from rbln_retrieval import ModelNotFoundError, ModelNotSupportedError, PoolingEngine
from rbln_retrieval.backend.config import BundledConfig, engine_overrides
from rbln_retrieval.models.source import resolve_model
from rbln_retrieval.server.serve import server_args

TOKEN = "hf_rbln_test_token_9c1d7e"
TEXTS = ["Paris is the capital of France.", "", "How are exceptions raised in Python?"]


def _one_sentence(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and message.endswith(".") and error.__cause__ is None and error.__suppress_context__
    return message


# -- resolution (no engine) -------------------------------------------------------------------------------------
def test_every_spelling_of_a_cached_id_names_one_snapshot(hub, minilm):
    by_id = resolve_model(HUB_MINILM)
    assert by_id.repo_id == HUB_MINILM and len(by_id.commit) == 40 and by_id.name == HUB_MINILM
    assert by_id.path == str(hub / f"models--{HUB_MINILM.replace('/', '--')}" / "snapshots" / by_id.commit)
    assert by_id.identity == {"id": HUB_MINILM, "commit": by_id.commit}
    for spelling, kwargs in [
        (f"{HUB_MINILM}@main", {}),
        (HUB_MINILM, {"revision": "main"}),
        (f"{HUB_MINILM}@{by_id.commit}", {}),
        (HUB_MINILM, {"cache_folder": str(hub), "local_files_only": True}),
        (by_id.path, {}),  # the snapshot directory itself keeps the id and commit
    ]:
        assert resolve_model(spelling, **kwargs).identity == by_id.identity, spelling
    local = resolve_model(minilm)  # a plain directory is used as is
    assert local.path == str(minilm) and local.identity == {"path": str(minilm.resolve())} and local.repo_id is None


def test_revisions_resolve_to_their_own_commit(hub):
    main, v2 = resolve_model(HUB_TINY), resolve_model(f"{HUB_TINY}@v2")
    assert (
        main.commit != v2.commit
        and (hub / f"models--{HUB_TINY.replace('/', '--')}" / "refs" / "v2").read_text() == v2.commit
    )


def test_only_the_files_the_engine_reads_are_fetched(hub, monkeypatch):
    calls = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    resolve_model(HUB_MINILM, token=TOKEN)
    resolve_model(HUB_MINILM, allow_pickle=True)
    resolve_model(HUB_MINILM, weights=False)
    safe, pickle, configs = calls
    assert safe["token"] == TOKEN and safe["local_files_only"] is True  # HF_HUB_OFFLINE=1 in the tests
    repo = [
        "model.safetensors",
        "model-00001-of-00002.safetensors",
        "config.json",
        "1_Pooling/config.json",
        "modules.json",
        "config_sentence_transformers.json",
        "sentence_bert_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
        "sentencepiece.bpe.model",
        "colbert_linear.pt",
        "sparse_linear.pt",
        "pytorch_model.bin",
        "onnx/model.onnx",
        "onnx/config.json",
        "openvino/openvino_model.bin",
        "README.md",
        "modeling_custom.py",
    ]

    def fetched(call):
        return set(
            filter_repo_objects(repo, allow_patterns=call["allow_patterns"], ignore_patterns=call["ignore_patterns"])
        )

    not_read = {
        "pytorch_model.bin",
        "onnx/model.onnx",
        "onnx/config.json",
        "openvino/openvino_model.bin",
        "README.md",
        "modeling_custom.py",
    }
    assert fetched(safe) == set(repo) - not_read
    assert fetched(pickle) == set(repo) - not_read | {"pytorch_model.bin"}
    assert not any(name.endswith((".safetensors", ".pt", ".bin")) for name in fetched(configs))


def test_an_uncached_revision_is_one_sentence(hub):
    with pytest.raises(ModelNotFoundError) as raised:
        resolve_model(f"{HUB_MINILM}@v9")
    message = _one_sentence(raised.value)
    assert "Revision 'v9' of sentence-transformers/all-MiniLM-L6-v2" in message and str(hub) in message
    assert "main" in message and f"hf download {HUB_MINILM} --revision v9" in message


def test_an_id_missing_from_the_cache_offline_says_how_to_fill_it(hub):
    with pytest.raises(ModelNotFoundError) as raised:
        resolve_model("no-such-org/no-such-model")
    message = _one_sentence(raised.value)
    assert message.startswith("no-such-org/no-such-model is not in the Hugging Face cache " + str(hub))
    assert "offline" in message and "hf download no-such-org/no-such-model" in message


def test_references_that_are_neither_a_directory_nor_an_id(hub):
    with pytest.raises(ModelNotSupportedError, match="Model directory '/no/such/model' does not exist"):
        resolve_model("/no/such/model")
    with pytest.raises(ModelNotSupportedError, match="neither a model directory nor a Hugging Face model id"):
        resolve_model("org/not a name")
    with pytest.raises(ValueError, match="names revision 'v2' but revision='main'"):
        resolve_model(f"{HUB_TINY}@v2", revision="main")


def test_a_config_class_from_another_repo_is_fetched_with_trust_remote_code_or_named_in_one_sentence(
    hub, tiny_models, tmp_path
):
    """Alibaba-NLP/gte-*-v1.5 name their config class "Alibaba-NLP/new-impl--configuration.NewConfig": transformers
    loads it from that repository's snapshot in the default cache, which offline must already hold it."""
    import shutil

    from transformers import AutoConfig

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_models["gte-new"], checkpoint)
    (checkpoint / "configuration.py").rename(tmp_path / "configuration.py")
    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "rbln-test/new-impl--configuration.NewConfig"}
    (checkpoint / "config.json").write_text(json.dumps(config))
    snapshot = hub_cache_snapshot(hub, "rbln-test/tiny-gte", checkpoint)
    assert resolve_model("rbln-test/tiny-gte").path == str(snapshot)  # the code is fetched only when trusted
    for model in ("rbln-test/tiny-gte", str(snapshot)):
        with pytest.raises(ModelNotFoundError) as raised:
            resolve_model(model, trust_remote_code=True)
        message = _one_sentence(raised.value)
        assert message.startswith(f"{model} takes its config class from rbln-test/new-impl--configuration.NewConfig")
        assert "configuration.py of rbln-test/new-impl is not in the Hugging Face cache" in message
        assert "hf download rbln-test/new-impl configuration.py" in message
    code = tmp_path / "code"
    code.mkdir()
    (tmp_path / "configuration.py").rename(code / "configuration.py")
    hub_cache_snapshot(hub, "rbln-test/new-impl", code)
    assert resolve_model("rbln-test/tiny-gte", trust_remote_code=True).path == str(snapshot)
    assert type(AutoConfig.from_pretrained(str(snapshot), trust_remote_code=True)).__name__ == "NewConfig"


def _hub_error(kind: type[Exception]) -> Exception:
    # The hub's own message echoes the token here, as a careless proxy might: it must not reach the caller.
    response = httpx2.Response(403, request=httpx2.Request("GET", "https://huggingface.co/api/models/org/gated"))
    return kind(f"refused Authorization: Bearer {TOKEN}", response=response)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (
            _hub_error(GatedRepoError),
            "org/gated is a gated model: accept its terms on huggingface.co, then pass a token",
        ),
        (_hub_error(RepositoryNotFoundError), "org/gated is not a model on the Hugging Face Hub, or it is private"),
        (_hub_error(RevisionNotFoundError), "org/gated has no revision 'v1' on the Hugging Face Hub."),
        (
            httpx2.ConnectError(f"no route {TOKEN}"),
            "Could not fetch org/gated@v1 from the Hugging Face Hub (ConnectError).",
        ),
    ],
)
def test_hub_errors_are_one_sentence_and_never_show_the_token(monkeypatch, caplog, raised, expected):
    """The hub's boundary is simulated: snapshot_download raises what huggingface_hub raises online."""
    caplog.set_level(logging.DEBUG)

    def refuse(*args, **kwargs):
        assert kwargs["token"] == TOKEN  # the token does reach the hub
        raise raised

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("org/gated@v1", token=TOKEN)
    assert expected in _one_sentence(error.value)
    assert TOKEN not in "".join(traceback.format_exception(error.value)) and TOKEN not in caplog.text


def test_a_new_revision_gets_new_compiled_graphs(hub):
    def cache_dir(reference: str):
        key = str(resolve_model(reference))
        overrides = engine_overrides(
            target="host", max_length=256, model=key, dtype="float32", strict_shapes=False, user={}
        )
        return BundledConfig.from_fields(overrides["additional_config"]["rbln_retrieval"]).cache_dir()

    main = cache_dir(HUB_TINY)
    assert main.name.startswith("tiny-bert-") and cache_dir(f"{HUB_TINY}@main") == main
    assert cache_dir(str(resolve_model(HUB_TINY).path)) == main and cache_dir(f"{HUB_TINY}@v2") != main


def test_serve_publishes_the_id_it_was_started_with(hub):
    args, target = server_args(f"{HUB_MINILM}@main", device="cpu", dtype="float32")
    assert args.served_model_name == [HUB_MINILM] and args.model == resolve_model(HUB_MINILM).path
    assert target == "host"


# -- one engine for every spelling ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hub_engine(hub_cache):
    return PoolingEngine.shared(HUB_MINILM, cache_folder=hub_cache, device="cpu", dtype="float32")


def test_an_id_embeds_like_its_local_directory_and_every_spelling_shares_the_engine(hub, hub_engine, minilm_engine):
    np.testing.assert_allclose(hub_engine.embed(TEXTS), minilm_engine.embed(TEXTS), atol=1e-5)
    assert hub_engine.score(TEXTS[2], TEXTS) == pytest.approx(minilm_engine.score(TEXTS[2], TEXTS), abs=1e-5)
    source = resolve_model(HUB_MINILM)
    for spelling, kwargs in [(f"{HUB_MINILM}@main", {}), (source.path, {}), (HUB_MINILM, {"token": TOKEN})]:
        with PoolingEngine.shared(spelling, device="cpu", dtype="float32", **kwargs) as claim:
            assert claim.engine is hub_engine.engine, spelling
    stats = hub_engine.stats()
    assert stats["model"] == {"id": HUB_MINILM, "commit": source.commit}
    assert stats["compile_cache"]["dir"] != minilm_engine.stats()["compile_cache"]["dir"]
