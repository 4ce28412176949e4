"""Secrets never show: every public object that takes a base URL or an API key (the four framework classes and
their sparse kin, RemoteEngine, get_engine's handle and its EngineSpec; the multimodal class is RBLNEmbedding's
subclass and needs an image-text server), made with a password in the base URL and an API key, shows neither in its
repr, str, model dump, logs or the errors of a call that fails against a server echoing the request's headers. No
engine: the servers are fakes (tests/http_fakes.py)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from http_fakes import FakeServer

from langchain_rbln import RBLNEmbeddings, RBLNReranker, RBLNSparseEmbeddings
from llama_index.embeddings.rbln import RBLNEmbedding, RBLNSparseEmbedding
from llama_index.postprocessor.rbln_rerank import RBLNReranker as NodeReranker
from rbln_retrieval import get_engine
from rbln_retrieval.frameworks.settings import shown_url
from rbln_retrieval.remote import RemoteEngine

PASSWORD, API_KEY = "pw-7c1e55a0", "sk-rbln-secret-93d1"
FRAMEWORK = {"family": "bi-encoder", "api_key": API_KEY}


def framework(cls: type, name: str, call: Callable[[Any], Any]) -> tuple[Callable[[str], Any], Callable[[Any], Any]]:
    return (lambda url: cls(**{name: "m"}, base_url=url, **FRAMEWORK)), call


OBJECTS: dict[str, tuple[Callable[[str], Any], Callable[[Any], Any]]] = {
    "langchain RBLNEmbeddings": framework(RBLNEmbeddings, "model", lambda o: o.embed_query("q")),
    "langchain RBLNSparseEmbeddings": framework(RBLNSparseEmbeddings, "model", lambda o: o.embed_query("q")),
    "langchain RBLNReranker": framework(
        RBLNReranker, "model", lambda o: o.rerank([], "q") or o._engine.score("q", ["a"])
    ),
    "llama_index RBLNEmbedding": framework(RBLNEmbedding, "model_name", lambda o: o.get_text_embedding("q")),
    "llama_index RBLNSparseEmbedding": framework(
        RBLNSparseEmbedding, "model_name", lambda o: o.get_query_embedding("q")
    ),
    "llama_index RBLNReranker": framework(NodeReranker, "model", lambda o: o._engine.score("q", ["a"])),
    "RemoteEngine": (
        lambda url: RemoteEngine("m", base_url=url, api_key=API_KEY, max_retries=1, family="bi-encoder"),
        lambda o: o.embed(["a"]),
    ),
    "get_engine": (
        lambda url: get_engine("m", base_url=url, api_key=API_KEY, max_retries=1, family="bi-encoder", attach=False),
        lambda o: o.embed(["a"]),
    ),
}


def shown(obj: Any) -> dict[str, str]:
    """Every way the object shows itself without a call."""
    views = {"repr": repr(obj), "str": str(obj)}
    for method in ("model_dump", "model_dump_json", "to_dict", "to_json", "dict", "json"):
        if callable(getattr(obj, method, None)):
            try:
                views[method] = str(getattr(obj, method)())
            except (TypeError, NotImplementedError):  # a LangChain deprecation shim that takes no arguments
                continue
    spec = getattr(getattr(obj, "_engine", obj), "spec", None)
    if spec is not None:
        views["spec"] = repr(spec)
    return views


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_no_public_object_shows_the_password_or_the_api_key(name, caplog):
    caplog.set_level(logging.DEBUG)
    make, use = OBJECTS[name]
    with FakeServer("echo-headers") as echo, FakeServer("500") as failing:
        for server in (echo, failing):
            url = server.url.replace("http://", f"http://alice:{PASSWORD}@") + "/"
            obj = make(url)
            with pytest.raises(Exception) as raised:
                use(obj)
            views = {**shown(obj), "error": "".join(traceback.format_exception(raised.value)), "logs": caplog.text}
            obj.close()
            for where, text in views.items():
                assert PASSWORD not in text and API_KEY not in text, f"{name}: a secret appears in its {where}: {text}"
    if "model_dump" in views:  # the URL is shown, its password masked
        assert shown_url(url) in views["model_dump"] and shown_url(url) in views["repr"]


def test_shown_url_masks_only_the_password():
    assert shown_url("https://alice:pw@host:8000/v1") == "https://alice:***@host:8000/v1"
    assert shown_url("https://alice@host/") == "https://alice@host/"
    assert shown_url("http://host:8000") == "http://host:8000"
