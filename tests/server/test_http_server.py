"""The server's own app (rbln_retrieval.server.app) in process, over the session's tiny engines: the check every
request passes before any work (nesting depth, JSON, typed fields, media: decompression bombs, remote URLs and
redirects to private addresses), the dialects' routes against the engine's own results, and slow uploads that
cannot hold every slot. No `serve` process: the app runs over httpx's ASGI transport, or uvicorn in a thread where
real sockets are needed."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from multimodal_builders import build_clip, png_bytes, sample_images
from PIL import Image

from rbln_retrieval import PoolingEngine
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, OUTPUTS_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.models.families import detect_family
from rbln_retrieval.models.files import weights_fingerprint
from rbln_retrieval.results.quantize import quantize_embeddings
from rbln_retrieval.server.app import build_app
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.limits import Limits
from rbln_retrieval.server.media import MediaCheck
from rbln_retrieval.server.served import Served, ServedModels

# A request whose headers promise a 1,000-byte body.
SLOW_HEADERS = b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
TEXTS = ["a cat sat on the mat", "stocks fell sharply today", "the weather is mild"]


def _app(engine, name: str = "tiny", limits: Limits | None = None, **options):
    description = {"model": name, "limits": (limits or Limits()).advertised(), "weights": "sha256:x"}
    return build_app(ServedModels([Served(name, engine, description)]), limits=limits or Limits(), **options)


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=120)


@pytest.fixture(scope="module")
def embedder(tiny_engine):
    return _app(tiny_engine)


@pytest.fixture(scope="module")
def reranker(tiny_models):
    with PoolingEngine.shared(tiny_models["bert-cross-encoder"], device="cpu", dtype="float32") as engine:
        yield engine


@pytest.fixture(scope="module")
def clip_family(tmp_path_factory):
    path = build_clip(tmp_path_factory.mktemp("clip") / "clip")
    return detect_family(path)


def _bomb() -> str:
    """A data URL of a 15,000 x 15,000 1-bit PNG: about 27 KB that would decode to 225 million pixels."""
    out = io.BytesIO()
    Image.new("1", (15_000, 15_000)).save(out, format="PNG", optimize=True)
    assert len(out.getvalue()) < 64_000
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _png_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


# -- the check every request passes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "status", "sentence"),
    [
        ("/v1/embeddings", b"[" * 20_000 + b"]" * 20_000, 400, "The body nests deeper than 32 levels"),
        ("/v1/embeddings", b'{"input": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", 400, "The body nests deeper than"),
        ("/embed", b'{"inputs": ' + b"[" * 40 + b"]" * 40 + b"}", 422, "The body nests deeper than 32 levels"),
        ("/v2/embed", b"{not json", 400, "The body is not valid JSON"),
        ("/v1/embeddings", b'{"input": ["a"], "dimensions": -3}', 400, "`dimensions`: Input should be greater than 0"),
        ("/embed", b"", 422, "The request has no body"),
        ("/v1/embeddings", b'{"input": [[101, 2000], [101, -5]]}', 400, "`input[1][1]` is -5, not a token id"),
        ("/v1/embeddings", b'{"model": "other", "input": ["a"]}', 404, "The model 'other' is not served here"),
        ("/predict", b'{"inputs": [["q", "d"]]}', 424, "tiny is an embedder, not a classifier"),
        ("/tokenize", b'{"inputs": []}', 422, "`inputs` is an empty list"),
        ("/decode", b'{"ids": [101, -1]}', 422, "`ids[1]` is -1, not a token id of this model"),
        ("/decode", b'{"ids": [[101], [7, 100000000000000000000]]}', 422, "`ids[1][1]` is 100000000000000000000"),
    ],
    ids=[
        "deep-list",
        "deep-input",
        "deep-tei",
        "not-json",
        "typed-field",
        "empty",
        "token-id-outside-the-vocabulary",
        "unknown-model",
        "424",
        "tokenize-nothing",
        "decode-negative",
        "decode-huge",
    ],
)
async def test_a_bad_body_is_refused_in_one_sentence_before_any_work(embedder, path, body, status, sentence):
    async with _client(embedder) as client:
        answer = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    body = answer.json()
    message = body["message"] if path.startswith("/v2") else body["error"]  # Cohere's body, TEI's
    message = message if isinstance(message, str) else message["message"]  # OpenAI's
    assert message.startswith(sentence) and "\n" not in message and "pydantic" not in message, message


def test_a_decompression_bomb_is_refused_413_naming_it_before_decoding(clip_family):
    with pytest.raises(Refused, match=r"^images\[1\] is over the limit of 50,000,000 pixels") as refused:
        MediaCheck().images(
            [("images[0]", _png_url(sample_images(1)[0])), ("images[1]", _bomb())], family=clip_family, model="clip"
        )
    assert refused.value.kind == "too_large"


def test_many_images_are_refused_past_the_request_pixel_budget(clip_family, monkeypatch):
    from rbln_retrieval.server import media

    images = sample_images(3)
    budget = sum(image.width * image.height for image in images[:2])
    monkeypatch.setattr(media, "MAX_REQUEST_PIXELS", budget)
    items = [(f"images[{i}]", _png_url(image)) for i, image in enumerate(images)]
    with pytest.raises(Refused, match=rf"^The request's images up to images\[2\] hold over {budget:,} pixels"):
        MediaCheck().images(items, family=clip_family, model="clip")


def test_a_remote_url_is_refused_and_no_connection_is_made(clip_family):
    """No domain is allowed by default: the server refuses the URL without resolving or connecting to it."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.5)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/x.png"
        with pytest.raises(Refused, match=r"^images\[0\] is a http URL, which this server does not fetch"):
            MediaCheck(resolver=lambda host: pytest.fail("resolved")).images(
                [("images[0]", url)], family=clip_family, model="clip"
            )
        with pytest.raises(TimeoutError):
            listener.accept()


@pytest.mark.parametrize(
    ("address", "refused"), [("127.0.0.1", True), ("10.1.2.3", True), ("169.254.169.254", True), ("::1", True)]
)
def test_an_allowed_domain_resolving_to_a_private_address_is_refused(clip_family, address, refused):
    check = MediaCheck(["images.example"], resolver=lambda host: [address])
    with pytest.raises(Refused, match="loopback, private, link-local or reserved address"):
        check.images([("images[0]", "https://images.example/cat.png")], family=clip_family, model="clip")


def test_a_redirect_to_a_private_address_is_refused_at_its_hop(clip_family, monkeypatch):
    """An allowed public host answering 302 to the cloud metadata address: the hop is checked before it is
    fetched."""
    fetched = []

    def handler(request: httpx.Request) -> httpx.Response:
        fetched.append(str(request.url))
        return httpx.Response(302, headers={"location": "http://metadata.internal/latest"})

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    addresses = {"images.example": ["93.184.216.34"], "metadata.internal": ["169.254.169.254"]}
    check = MediaCheck(["images.example", "metadata.internal"], resolver=addresses.__getitem__)
    with pytest.raises(Refused, match=r"^images\[0\]'s host metadata.internal resolves to 169.254.169.254"):
        check.images([("images[0]", "http://images.example/cat.png")], family=clip_family, model="clip")
    assert fetched == ["http://93.184.216.34/cat.png"]


def test_an_allowed_domain_is_resolved_once_and_fetched_from_the_address_checked(clip_family, monkeypatch):
    """DNS rebinding: the name resolves to a public address when checked and to loopback on any later lookup. The
    fetch connects to the address checked (the client never resolves the name), keeping the name in the Host header
    and the TLS server name; a redirect's hop is resolved and pinned the same way."""
    png = png_bytes(sample_images(1)[0])
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((str(request.url), request.headers["host"], request.extensions.get("sni_hostname")))
        if request.url.path == "/cat.png":
            return httpx.Response(302, headers={"location": "https://cdn.example/c.png"})
        return httpx.Response(200, content=png)

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    answers = {"images.example": [["93.184.216.34"], ["127.0.0.1"]], "cdn.example": [["2606:2800:220:1::1"], ["::1"]]}
    lookups = []

    def rebinding(host: str) -> list[str]:
        lookups.append(host)
        return answers[host].pop(0)

    check = MediaCheck(["images.example", "cdn.example"], resolver=rebinding)
    (image,) = check.images([("images[0]", "https://images.example:8443/cat.png")], family=clip_family, model="c")
    assert image.size == sample_images(1)[0].size
    assert lookups == ["images.example", "cdn.example"]
    assert sent == [
        ("https://93.184.216.34:8443/cat.png", "images.example:8443", "images.example"),
        ("https://[2606:2800:220:1::1]/c.png", "cdn.example", "cdn.example"),
    ]


async def test_images_to_a_text_model_and_urls_in_cohere_embed_are_refused(embedder):
    async with _client(embedder) as client:
        answer = await client.post("/v2/embed", json={"images": ["http://127.0.0.1:9/x.png"], "input_type": "image"})
    assert answer.status_code == 400
    assert answer.json()["message"].startswith("images[0] holds an image, but tiny is a bi-encoder model")


# -- the dialects against the engine -------------------------------------------------------------------------------
async def test_openai_embeddings_equal_the_engine_floats_and_base64(embedder, tiny_engine):
    want = tiny_engine.embed(TEXTS, instruction="")
    async with _client(embedder) as client:
        floats = (await client.post("/v1/embeddings", json={"model": "tiny", "input": TEXTS})).json()
        packed = (await client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"})).json()
    assert floats["model"] == "tiny" and floats["usage"]["prompt_tokens"] > 0
    np.testing.assert_array_equal(np.array([row["embedding"] for row in floats["data"]], dtype=np.float32), want)
    rows = [np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in packed["data"]]
    np.testing.assert_array_equal(np.stack(rows), want)


async def test_openai_embeddings_of_token_ids_equal_their_texts_and_truncate_as_asked(embedder, tiny_engine):
    """Token ids (vLLM's /v1/embeddings takes them; LangChain's OpenAIEmbeddings sends them): the text's own ids
    give the text's vector; an over-long prompt is refused naming it, or cut to the max length when asked."""
    ids = tiny_engine.tokenizer.hf(TEXTS)["input_ids"]
    long = [ids[0][0], *([ids[0][1]] * 600), ids[0][-1]]
    max_length = tiny_engine.family.tokens.max_length
    async with _client(embedder) as client:
        many = await client.post("/v1/embeddings", json={"input": ids})
        one = await client.post("/v1/embeddings", json={"input": ids[1]})
        refused = await client.post("/v1/embeddings", json={"input": [ids[0], long]})
        cut = await client.post("/v1/embeddings", json={"input": long, "truncate_prompt_tokens": max_length})
    want = tiny_engine.embed(TEXTS, instruction="")
    assert many.status_code == 200, many.text
    np.testing.assert_allclose(np.array([r["embedding"] for r in many.json()["data"]]), want, atol=1e-5)
    np.testing.assert_allclose(one.json()["data"][0]["embedding"], want[1], atol=1e-5)
    assert many.json()["usage"]["prompt_tokens"] == sum(len(row) for row in ids)
    assert refused.status_code == 400 and "input[1] is 602 tokens" in refused.json()["error"]["message"]
    assert cut.status_code == 200 and len(cut.json()["data"][0]["embedding"]) == want.shape[1]


async def test_tei_embed_root_tokenize_decode_and_info(embedder, tiny_engine):
    async with _client(embedder) as client:
        embed = (await client.post("/embed", json={"inputs": TEXTS})).json()
        root = (await client.post("/", json={"inputs": TEXTS[0]})).json()
        tokens = (await client.post("/tokenize", json={"inputs": "a cat"})).json()
        decoded = (await client.post("/decode", json={"ids": [t["id"] for t in tokens[0]]})).json()
        info = (await client.get("/info")).json()
        sparse = await client.post("/embed_sparse", json={"inputs": "a cat"})
    np.testing.assert_array_equal(np.array(embed, dtype=np.float32), tiny_engine.embed(TEXTS, instruction=""))
    assert root == embed[:1]
    assert [t["text"] for t in tokens[0] if not t["special"]] == ["a", "cat"] and decoded == ["a cat"]
    assert info["model_id"] == "tiny" and info["model_type"] == {"embedding": {"pooling": "cls"}}
    assert sparse.status_code == 422 and "cannot give output='sparse'" in sparse.json()["error"]


async def test_tei_similarity_on_post_root_and_similarity_is_the_cosine_of_the_engines_vectors(embedder, tiny_engine):
    """huggingface_hub's sentence_similarity posts ``{"inputs": {"source_sentence", "sentences"}}`` to POST /."""
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    async with _client(embedder) as client:
        root = await client.post("/", json=body)
        similarity = await client.post("/similarity", json=body)
    limited = _app(tiny_engine, limits=Limits(max_inputs_per_request=2))
    async with _client(limited) as client:
        too_many = await client.post("/similarity", json=body)
    vectors = tiny_engine.embed(TEXTS, instruction="")
    assert too_many.status_code == 413 and "inputs" in too_many.json()["error"], too_many.text
    assert root.status_code == 200, root.text
    np.testing.assert_allclose(root.json(), vectors[1:] @ vectors[0], atol=1e-6)
    assert similarity.json() == root.json()


async def test_cohere_embed_maps_input_type_onto_prompts_and_embedding_types_onto_quantization(embedder, tiny_engine):
    """A model without prompts accepts every input_type (Cohere's clients always send one)."""
    body = {"texts": TEXTS, "input_type": "search_document", "embedding_types": ["float", "int8", "ubinary", "base64"]}
    async with _client(embedder) as client:
        answer = (await client.post("/v2/embed", json=body)).json()
        query = (await client.post("/v2/embed", json={**body, "input_type": "search_query"})).json()
    want = tiny_engine.embed(TEXTS)
    embeddings = answer["embeddings"]
    np.testing.assert_array_equal(np.array(embeddings["float"], dtype=np.float32), want)
    np.testing.assert_array_equal(np.array(query["embeddings"]["float"], dtype=np.float32), want)
    ranges = np.array([[-1.0] * want.shape[1], [1.0] * want.shape[1]], dtype=np.float32)
    assert embeddings["int8"] == quantize_embeddings(want, "int8", ranges=ranges).tolist()
    assert embeddings["ubinary"] == quantize_embeddings(want, "ubinary").tolist()
    assert answer["meta"]["billed_units"]["input_tokens"] > 0 and answer["texts"] == TEXTS


async def test_cohere_v1_embed_answers_floats_without_embedding_types_and_by_type_with_them(embedder, tiny_engine):
    """cohere.Client (v1), which langchain-cohere's CohereEmbeddings uses, posts to /v1/embed."""
    async with _client(embedder) as client:
        floats = await client.post("/v1/embed", json={"texts": TEXTS, "model": "tiny", "input_type": "search_query"})
        typed = await client.post("/v1/embed", json={"texts": TEXTS, "embedding_types": ["float", "int8"]})
    want = tiny_engine.embed(TEXTS)
    assert floats.status_code == 200, floats.text
    assert floats.json()["response_type"] == "embeddings_floats" and floats.json()["texts"] == TEXTS
    np.testing.assert_array_equal(np.array(floats.json()["embeddings"], dtype=np.float32), want)
    assert typed.json()["response_type"] == "embeddings_by_type" and set(typed.json()["embeddings"]) == {
        "float",
        "int8",
    }
    np.testing.assert_array_equal(np.array(typed.json()["embeddings"]["float"], dtype=np.float32), want)
    assert floats.json()["meta"]["api_version"] == {"version": "1"}


async def test_rerank_dialects_equal_the_engine_and_accept_null_max_tokens_per_doc(reranker):
    app = _app(reranker, "ce")
    want = reranker.score("a cat", TEXTS)
    best = int(np.argmax(want))
    async with _client(app) as client:
        cohere = await client.post(
            "/v2/rerank", json={"query": "a cat", "documents": TEXTS, "max_tokens_per_doc": None}
        )
        jina = await client.post("/v1/rerank", json={"model": "ce", "query": "a cat", "documents": TEXTS, "top_n": 1})
        tei = (await client.post("/rerank", json={"query": "a cat", "texts": TEXTS, "return_text": True})).json()
        score = (await client.post("/score", json={"queries": "a cat", "documents": TEXTS})).json()
        predict = (await client.post("/predict", json={"inputs": ["a cat", TEXTS[0]]})).json()
        embed = await client.post("/embed", json={"inputs": "a cat"})
    assert cohere.status_code == 200, cohere.text
    assert [(r["index"], r["relevance_score"]) for r in cohere.json()["results"]] == reranker.rerank("a cat", TEXTS)
    assert cohere.json()["meta"]["billed_units"] == {"search_units": 1}
    assert jina.json()["results"] == [{"index": best, "relevance_score": want[best], "document": {"text": TEXTS[best]}}]
    assert jina.json()["usage"]["total_tokens"] > 0
    assert tei[0] == {"index": best, "score": want[best], "text": TEXTS[best]}
    assert [row["score"] for row in score["data"]] == want
    assert predict == [{"label": "LABEL_0", "score": want[0]}]
    assert embed.status_code == 424 and embed.json()["error_type"] == "backend"


async def test_a_cross_encoder_classifies_one_text_alone_on_predict_and_root(reranker, tiny_models):
    """huggingface_hub's text_classification posts one text to POST /: the classifier head on that one sequence
    (as transformers runs it), not a pair."""
    import torch
    from tolerances import FP32_VS_REFERENCE
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    async with _client(_app(reranker, "ce")) as client:
        predict = await client.post("/predict", json={"inputs": TEXTS[2]})
        root = await client.post("/", json={"inputs": TEXTS[2], "raw_scores": True})
    path = tiny_models["bert-cross-encoder"]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        logit = float(model(**AutoTokenizer.from_pretrained(path)(TEXTS[2], return_tensors="pt")).logits[0, 0])
    assert predict.status_code == 200, predict.text
    [answer] = predict.json()
    assert answer["label"] == "LABEL_0"
    assert answer["score"] == pytest.approx(float(torch.sigmoid(torch.tensor(logit))), abs=FP32_VS_REFERENCE)
    assert root.json()[0]["score"] == pytest.approx(logit, abs=1e-3)


async def test_own_routes_describe_quantize_and_give_outputs(embedder, tiny_engine):
    async with _client(embedder) as client:
        described = (await client.get(DESCRIBE_PATH)).json()
        quantized = (await client.post(QUANTIZED_EMBED_PATH, json={"input": TEXTS, "precision": "binary"})).json()
        outputs = (await client.post(OUTPUTS_PATH, json={"input": TEXTS, "output": ["dense"], "kind": "query"})).json()
        schema = (await client.get("/openapi.json")).json()
    assert described["weights"] == "sha256:x"
    binary = np.stack([np.frombuffer(base64.b64decode(r["embedding"]), dtype=np.int8) for r in quantized["data"]])
    np.testing.assert_array_equal(binary, tiny_engine.embed(TEXTS, instruction="", precision="binary"))
    dense = np.stack([np.frombuffer(base64.b64decode(r["dense"]), dtype="<f4") for r in outputs["data"]])
    np.testing.assert_array_equal(dense, tiny_engine.embed(TEXTS, kind="query"))
    for path in ("/v1/embeddings", "/embed", "/v2/embed", "/v2/rerank", "/v1/rerank", OUTPUTS_PATH):
        assert "requestBody" in schema["paths"][path]["post"], path
    assert "/pooling" not in schema["paths"] and "/v1/chat/completions" not in schema["paths"]


async def test_the_probes_answer_the_content_types_their_schema_declares(embedder):
    """Supervisors read an empty 200 and Prometheus its exposition text; the schema says so, not JSON."""
    async with _client(embedder) as client:
        schema = (await client.get("/openapi.json")).json()["paths"]
        answers = {path: await client.get(path) for path in ("/health", "/ping", "/metrics")}
        posted = await client.post("/ping")
    for path in ("/health", "/ping"):
        assert answers[path].status_code == 200 and answers[path].content == b""
        assert not schema[path]["get"]["responses"]["200"].get("content"), path
    assert not schema["/ping"]["post"]["responses"]["200"].get("content") and posted.status_code == 200
    assert list(schema["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert answers["/metrics"].headers["content-type"].startswith("text/plain")


async def test_the_api_key_guards_every_route_but_the_probes_in_the_routes_dialect(tiny_engine):
    app = _app(tiny_engine, api_keys=["k"])
    async with _client(app) as client:
        tei = await client.post("/embed", json={"inputs": "a"})
        openai = await client.post("/v1/embeddings", json={"input": "a"})
        unknown = await client.post("/pooling", json={"input": "a"})
        health = await client.get("/health")
        keyed = await client.post("/embed", json={"inputs": "a"}, headers={"Authorization": "Bearer k"})
    assert (tei.status_code, openai.status_code, unknown.status_code) == (401, 401, 401)
    assert "error_type" in tei.json() and "message" in openai.json()["error"]
    assert health.status_code == 200 and keyed.status_code == 200


# -- slow uploads --------------------------------------------------------------------------------------------------
def test_slow_senders_lose_their_slot_and_a_normal_request_still_succeeds(tiny_engine):
    """Two slow senders take both slots (their headers promise a body that never comes); after upload_seconds
    they get 408 and the slots are free, so a normal client, retrying on 429 as RemoteEngine does, gets its
    vectors. The outcome does not depend on timing: only on the deadline passing."""
    import uvicorn

    app = _app(tiny_engine, limits=Limits(max_concurrent_requests=2, upload_seconds=1))
    with socket.create_server(("127.0.0.1", 0)) as sock:
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
        thread.start()
        try:
            while not server.started:
                time.sleep(0.05)
            port = sock.getsockname()[1]
            slow = []
            for _ in range(2):
                conn = socket.create_connection(("127.0.0.1", port))
                conn.sendall(SLOW_HEADERS + b"{")
                slow.append(conn)
            statuses = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                answer = httpx.post(f"http://127.0.0.1:{port}/embed", json={"inputs": "a cat"}, timeout=60)
                statuses.append(answer.status_code)
                if answer.status_code != 429:
                    break
                time.sleep(float(answer.headers["retry-after"]) / 4)
            assert statuses[-1] == 200 and set(statuses) <= {200, 429}, statuses
            for conn in slow:
                conn.settimeout(60)
                assert conn.recv(4096).startswith(b"HTTP/1.1 408"), "a slow sender kept its slot"
                conn.close()
        finally:
            server.should_exit = True
            thread.join(timeout=30)


# -- the weights fingerprint ---------------------------------------------------------------------------------------
def test_the_weights_fingerprint_tells_snapshots_apart(tmp_path, tiny_models):
    import shutil

    source = tiny_models["bert-cls"]
    copy = shutil.copytree(source, tmp_path / "copy")
    assert weights_fingerprint(source) == weights_fingerprint(copy)
    other = tmp_path / "other"
    shutil.copytree(source, other)
    weights = other / "model.safetensors"
    data = bytearray(weights.read_bytes())
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["dtype"] = "F16" if header[name]["dtype"] != "F16" else "F32"
    encoded = json.dumps(header).encode().ljust(length)
    weights.write_bytes(bytes(data[:8]) + encoded[:length] + bytes(data[8 + length :]))
    assert weights_fingerprint(other) != weights_fingerprint(source)


async def test_the_engine_work_is_cancelled_when_the_client_disconnects(tiny_engine):
    """The client leaves once its embedding has begun: the engine call is cancelled, nothing is answered."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    class Stalling:  # the served engine's embedding never ends on its own
        family, model, dimension = tiny_engine.family, "tiny", tiny_engine.dimension

        async def aembed(self, texts, **options):
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    app = build_app(ServedModels([Served("tiny", Stalling(), {})]), limits=Limits())  # type: ignore[arg-type]
    messages = [{"type": "http.request", "body": b'{"input": ["a"]}', "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await started.wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embeddings",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    # The bound only keeps a broken route from hanging the suite: the work ends by cancellation, not by time.
    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    assert cancelled.is_set()
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499]


async def test_a_failure_below_the_check_is_500_naming_the_request_id_without_a_traceback(tiny_engine):
    class Failing:  # the served engine fails deep inside, as a dead engine or a bug would
        family, model, dimension = tiny_engine.family, "tiny", tiny_engine.dimension

        async def aembed(self, texts, **options):
            raise RuntimeError("Traceback (most recent call last): deep inside")

    app = build_app(ServedModels([Served("tiny", Failing(), {})]), limits=Limits())  # type: ignore[arg-type]
    async with _client(app) as client:
        answer = await client.post("/embed", json={"inputs": "a"}, headers={"x-request-id": "req-42"})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "The server failed on this request (request id req-42); its log names the cause.",
        "error_type": "backend",
    }
