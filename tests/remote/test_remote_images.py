"""Images over the API: `rbln-retrieval serve` of a tiny CLIP answers vLLM's chat-style /v1/embeddings, RemoteEngine
sends images as data URLs and gets the local engine's vectors, and the server refuses bad images, URLs it would have
to fetch and requests without the key, each in one sentence. One server and one local engine for the module."""

from __future__ import annotations

import base64
import dataclasses
import io
from pathlib import Path

import httpx
import numpy as np
import pytest
from multimodal_builders import build_clip, png_bytes, sample_images
from PIL import Image
from servers import Server

from rbln_retrieval import PoolingEngine
from rbln_retrieval.engines.protocol import DESCRIBE_PATH
from rbln_retrieval.remote import RemoteAuthError, RemoteEngine
from rbln_retrieval.server.app import build_app
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.limits import Limits
from rbln_retrieval.server.media import MediaCheck
from rbln_retrieval.server.served import Served, ServedModels

pytestmark = pytest.mark.server

API_KEY = "image-key-7c1e04"
MIN_COSINE = 0.99999  # float32 on both sides
TEXTS = ["a photo of a cat", "the quick brown fox jumps over the lazy dog", "red"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return build_clip(tmp_path_factory.mktemp("remote-images") / "clip")


@pytest.fixture(scope="module")
def server(clip, tmp_path_factory):
    started = Server(clip, tmp_path_factory.mktemp("server-logs") / "clip.log", api_key=API_KEY)
    try:
        started.wait_ready()
        yield started
    finally:
        code = started.stop()
    assert code == 0, f"the CLIP server did not shut down cleanly on SIGTERM (exit {code})"


@pytest.fixture(scope="module")
def local(clip):
    handle = PoolingEngine.shared(clip, device="cpu", dtype="float32")
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def remote(clip, server):
    with RemoteEngine(clip, base_url=server.url, api_key=API_KEY, batch_size=3) as engine:
        yield engine


def _min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    assert got.dtype == np.float32 and got.shape == want.shape
    return float(np.min(np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)))


def _jpeg(image: Image.Image, orientation: int | None = None) -> bytes:
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(out, format="JPEG", quality=90, exif=exif)
    return out.getvalue()


def _images(tmp_path: Path) -> list:
    """Every form and mode an engine takes: PIL images in RGB and other modes, a PNG file, JPEG bytes and a JPEG with
    an EXIF orientation (RGB files: sent as they are), another opened as a PIL image and a PNG with
    transparency (re-encoded, turned upright as vLLM turns the image it is given). Made anew for each call: a file
    object is read once."""
    pictures = sample_images(9, seed=11)  # one each: rankings are compared, and equal images would tie
    file = tmp_path / "picture.png"
    file.write_bytes(png_bytes(pictures[1]))
    return [
        pictures[0],
        file,
        _jpeg(pictures[2]),
        io.BytesIO(_jpeg(pictures[3], orientation=6)),
        Image.open(io.BytesIO(_jpeg(pictures[4], orientation=8))),
        png_bytes(pictures[5].convert("RGBA")),
        pictures[6].convert("L"),
        pictures[7].convert("P"),
        pictures[8].convert("CMYK"),
    ]


def test_remote_images_equal_the_local_engines_in_the_space_of_its_texts(tmp_path, local, remote):
    got, want = remote.embed_images(_images(tmp_path)), local.embed_images(_images(tmp_path))
    figure = _min_cosine(got, want)
    print(f"remote vs local image vectors: min cosine {figure:.7f} over {len(want)} images")
    assert figure >= MIN_COSINE
    raw = remote.embed_images(_images(tmp_path), normalize=False)
    assert _min_cosine(raw, local.embed_images(_images(tmp_path), normalize=False)) >= MIN_COSINE
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    texts = remote.embed(TEXTS)
    assert _min_cosine(texts, local.embed(TEXTS)) >= MIN_COSINE
    # One space: a text query scores each image as the dot product of the remote vectors, as a local engine does.
    scores = remote.score_images(TEXTS[0], _images(tmp_path))
    np.testing.assert_allclose(scores, got @ remote.embed([TEXTS[0]], kind="query")[0], atol=1e-6)
    np.testing.assert_allclose(scores, local.score_images(TEXTS[0], _images(tmp_path)), atol=1e-5)
    best, local_best = (
        remote.rerank_images(TEXTS[0], _images(tmp_path), top_n=3),
        local.rerank_images(TEXTS[0], _images(tmp_path), top_n=3),
    )
    assert [i for i, _ in best] == [i for i, _ in local_best]
    np.testing.assert_allclose([s for _, s in best], [s for _, s in local_best], atol=1e-5)
    assert remote.embed_images([]).shape == (0, 32)


async def test_async_image_calls_equal_the_sync_ones(tmp_path, remote):
    images = _images(tmp_path)[:3]  # no file object: each is read by both calls
    np.testing.assert_array_equal(await remote.aembed_images(images), remote.embed_images(images))
    assert await remote.ascore_images(TEXTS[1], images) == remote.score_images(TEXTS[1], images)
    assert await remote.arerank_images(TEXTS[1], images, top_n=2) == remote.rerank_images(TEXTS[1], images, top_n=2)


def _truncated_png() -> bytes:
    data = png_bytes(sample_images(1)[0])
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "item",
    ["cat.png", b"not an image", _truncated_png(), Image.new("I;16", (8, 8)), Path("/nonexistent/cat.png"), 3.5],
    ids=["str", "not-an-image", "truncated", "16-bit", "missing-file", "float"],
)
def test_a_bad_image_is_refused_before_sending_in_the_local_sentence(item, local, remote, server):
    with pytest.raises((TypeError, ValueError)) as locally:
        local.embed_images([sample_images(1)[0], item])
    with pytest.raises(locally.type) as remotely:
        remote.embed_images([sample_images(1)[0], item])
    assert str(remotely.value) == str(locally.value)
    assert str(remotely.value).startswith("images[1]")


def _post(server: Server, urls: list[str], key: str | None = API_KEY) -> httpx.Response:
    conversations = [[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}}]}] for u in urls]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + "/v1/embeddings", json={"messages": conversations}, headers=headers, timeout=120)


def _data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _over_the_pixel_limit() -> bytes:
    out = io.BytesIO()
    Image.new("1", (8000, 7000)).save(out, format="PNG")  # 56 megapixels of one bit: a few kilobytes as a PNG
    return out.getvalue()


@pytest.mark.parametrize(
    ("url", "sentence"),
    [
        (_data_url(b"hello", "text/plain"), "messages[1] is a data URL of text/plain, not an image."),
        (_data_url(b"not an image"), "messages[1] is not an image file PIL can decode."),
        (_data_url(_truncated_png()), "messages[1] is truncated or corrupt ("),
        (_data_url(_over_the_pixel_limit()), "messages[1] is 8000x7000 pixels, over the limit of 50,000,000 pixels."),
        ("data:image/png;base64,%%%", "messages[1]'s data URL is not valid base64."),
        ("http://127.0.0.1:9/cat.png", "messages[1] is a http URL, which this server does not fetch; send the image"),
        ("file:///etc/hostname", "messages[1] is a file URL, which this server does not fetch; send the image"),
    ],
    ids=["text", "not-an-image", "truncated", "pixels", "base64", "http", "file"],
)
def test_the_server_refuses_a_bad_image_in_one_sentence_naming_it(url, sentence, server):
    good = _data_url(png_bytes(sample_images(1)[0]))
    answer = _post(server, [good, url])
    # An image over the pixel bound is refused as too large, before it is decoded.
    assert answer.status_code == (413 if "pixels, over the limit" in sentence else 400), answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith(sentence) and "\n" not in message and "Traceback" not in message


def test_the_server_embeds_posted_data_urls_as_the_local_engine_does(server, local):
    images = sample_images(3, seed=4)
    answer = _post(server, [_data_url(png_bytes(image)) for image in images])
    assert answer.status_code == 200, answer.text
    rows = np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float32)
    assert _min_cosine(rows, local.embed_images(images)) >= MIN_COSINE


def test_the_api_key_guards_the_image_route(server, clip):
    good = [_data_url(png_bytes(sample_images(1)[0]))]
    assert _post(server, good, key=None).status_code == 401
    assert _post(server, good, key="wrong").status_code == 401
    with RemoteEngine(clip, base_url=server.url, api_key="wrong") as stranger:
        with pytest.raises(RemoteAuthError, match="rejected the request with HTTP 401"):
            stranger.embed_images(sample_images(1))


def test_the_description_says_the_model_embeds_images(server, remote):
    description = httpx.get(server.url + DESCRIBE_PATH, headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert description["family"]["image_size"] == 32
    assert remote.family.embeds_images


def test_a_text_model_refuses_images_in_one_sentence_on_both_sides(clip, server):
    """The client refuses before sending; a server of a text model refuses what another client sends."""
    with RemoteEngine(clip, base_url=server.url, api_key=API_KEY) as engine:
        engine._remote.family = dataclasses.replace(engine.family.replace(image_size=0), name="bert")
        texts_only = r"is a bert model, which embeds texts only; images need CLIP, SigLIP or ColPali\.$"
        with pytest.raises(ValueError, match=texts_only):
            engine.embed_images(sample_images(1))
        text_family = engine._remote.family
    with pytest.raises(Refused) as refused:
        MediaCheck().images([("messages[0]", "data:")], family=text_family, model="minilm")
    assert refused.value.message == (
        "messages[0] holds an image, but minilm is a bert model, which embeds texts only; images need CLIP, SigLIP "
        "or ColPali."
    )


@pytest.mark.parametrize(
    ("url", "refused"),
    [("https://images.example/cat.png", False), ("https://other.example/cat.png", True), ("file:///cat.png", True)],
)
def test_only_the_domains_the_server_allows_are_fetched(url, refused):
    """--allowed-media-domains (after `--`) is the one way to let the server fetch an image; the allowed URL's hop
    passes the check (the fetch itself is not made here: tests/server/test_http_server.py fetches through a mock)."""
    check = MediaCheck(["images.example"], resolver=lambda host: ["93.184.216.34"])
    if refused:
        with pytest.raises(Refused, match=r"^images\[0\] "):
            check.image_bytes(url, "images[0]")
    else:
        check._check_target(url, "images[0]")


def test_the_framework_classes_embed_images_through_the_server(tmp_path, clip, server, local):
    from langchain_rbln import RBLNEmbeddings
    from llama_index.embeddings.rbln import RBLNMultiModalEmbedding

    files = []
    for i, image in enumerate(sample_images(3, seed=8)):
        files.append(str(tmp_path / f"{i}.png"))
        Path(files[-1]).write_bytes(png_bytes(image))
    want = local.embed_images([Path(f) for f in files])
    langchain = RBLNEmbeddings(model=str(clip), base_url=server.url, api_key=API_KEY)
    llama = RBLNMultiModalEmbedding(model_name=str(clip), base_url=server.url, api_key=API_KEY)
    assert _min_cosine(np.array(langchain.embed_image(files), dtype=np.float32), want) >= MIN_COSINE
    assert _min_cosine(np.array(llama.get_image_embedding_batch(files), dtype=np.float32), want) >= MIN_COSINE
    query = np.array(llama.get_query_embedding(TEXTS[0]), dtype=np.float32)
    np.testing.assert_allclose(query, local.embed([TEXTS[0]], kind="query")[0], atol=1e-5)


@pytest.mark.parametrize(
    ("part", "sentence"),
    [
        (
            b'{"type": "video_url", "video_url": {"url": "http://a/b"}}',
            "messages[0] holds a video_url part; this route embeds one image per conversation",
        ),
        (  # a media key behind a JSON escape is parsed as the key it spells
            b'{"type": "image\\u005furl", "image\\u005furl": "file:///x"}',
            "messages[0] is a file URL, which this server does not fetch",
        ),
    ],
    ids=["video", "escaped-key"],
)
async def test_media_in_a_request_goes_through_the_one_check(local, part, sentence):
    import httpx

    app = build_app(ServedModels([Served("clip", local, {})]), limits=Limits())
    body = b'{"messages": [[{"role": "user", "content": [' + part + b"]}]]}"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        answer = await client.post("/v1/embeddings", content=body)
    assert answer.status_code == 400 and answer.json()["error"]["message"].startswith(sentence), answer.text
