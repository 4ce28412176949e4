"""Images in requests, checked before vLLM sees them: content parts carrying an ``image_url`` anywhere in a request
(chat-style ``messages`` or chat ``input``, as vLLM's /v1/embeddings, /pooling and /invocations take them for CLIP and
SigLIP; a scoring request's multimodal documents). Video and audio parts are refused: vLLM would fetch their URLs.

An image travels as a ``data:image/...;base64,`` URL and is decoded here with the client's own checks
(rbln_retrieval.text.images: not an image, truncated, over MAX_PIXELS, 16-bit or float pixels), so a bad one is
refused with HTTP 400 in one sentence naming it, never a traceback. A URL the server would fetch (http, https) is
refused unless the server was started with vLLM's own ``--allowed-media-domains`` and the URL's host is one of them
(vLLM then fetches it); a ``file:`` URL or any other scheme is always refused: the server never reads what a request
points at. A text model's server refuses images in one sentence too. limits.py's Backpressure runs the check on a
request's whole body, after the request has taken its slot and its size is bounded.

Imports: models (multimodal), text (images); the standard library.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from rbln_retrieval.models.multimodal import texts_only
from rbln_retrieval.text.images import load_image

# The content parts vLLM loads media from; a CLIP or SigLIP server takes images only, and vLLM would fetch the
# others' URLs before finding that out.
MEDIA_KEYS = ("image_url", "video_url", "audio_url")


def media_urls(request: dict[str, Any]) -> Iterator[tuple[str, int, str, Any]]:
    """(field, index, key, url) of every media part anywhere in ``request`` (chat ``messages`` or ``input``, a
    scoring request's multimodal documents, ...): index is the item's in the field's list (a conversation of a
    batch, a message of the one conversation, a document), key the part's media key."""
    for field, value in request.items():
        for index, item in enumerate(value if isinstance(value, list) else [value]):
            for key, url in _media(item):
                yield field, index, key, url


def _media(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key in MEDIA_KEYS:
            if key in value:
                url = value[key]
                yield key, url.get("url") if isinstance(url, dict) else url
        children: Any = value.values()
    else:
        children = value if isinstance(value, list) else ()
    for child in children:
        if isinstance(child, (dict, list)):
            yield from _media(child)


def image_refusal(request: Any, *, model: str, family: dict[str, Any], allowed_domains: list[str]) -> str | None:
    """The sentence refusing the first bad image (or other media) of ``request`` (a parsed JSON body), or None."""
    for field, index, key, url in media_urls(request):
        name = f"{field}[{index}]"
        if key != "image_url":
            return f"{name} holds a {key}; this server embeds images only, sent as data:image/...;base64, URLs."
        if not family.get("image_size"):
            return f"{name} holds an image, but {texts_only(model, str(family.get('name')))}"
        if not isinstance(url, str):
            return f"{name}'s image_url is {type(url).__name__}; send the image as a data:image/...;base64, URL."
        scheme = url.partition(":")[0].lower()
        if scheme in ("http", "https") and urlsplit(url).hostname in allowed_domains:
            continue
        if scheme != "data":
            return (
                f"{name} is a {scheme or 'schemeless'} URL, which this server does not fetch; send the image itself "
                "as a data:image/...;base64, URL."
            )
        if refused := _data_url_refusal(url, name, index, field):
            return refused
    return None


def _data_url_refusal(url: str, name: str, index: int, field: str) -> str | None:
    header, comma, data = url[len("data:") :].partition(",")
    media_type, *params = header.split(";")
    if not comma or "base64" not in params:
        return f"{name} is a data URL without base64 data; send data:image/...;base64,<the image file's bytes>."
    if not media_type.lower().startswith("image/"):
        return f"{name} is a data URL of {media_type or 'no media type'}, not an image."
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"{name}'s data URL is not valid base64."
    try:
        load_image(raw, index, field)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


class ImageCheck:
    """Backpressure's check of a whole body (limits.py): the sentence refusing its first bad image, or None. Only a
    body with media parts is parsed (again) and decoded, off the event loop."""

    def __init__(self, *, model: str, family: dict[str, Any], allowed_domains: list[str] | None):
        self.model, self.family, self.allowed_domains = model, family, list(allowed_domains or [])

    async def __call__(self, body: bytes) -> str | None:
        # A media key is spelled out, or hidden behind a JSON escape (which non-ASCII text has too).
        return await asyncio.to_thread(self._refusal, body) if b'_url"' in body or b"\\u" in body else None

    def _refusal(self, body: bytes) -> str | None:
        try:
            request = json.loads(body)
        except ValueError:
            return None  # vLLM answers a body that is not JSON itself
        if not isinstance(request, dict):
            return None
        return image_refusal(request, model=self.model, family=self.family, allowed_domains=self.allowed_domains)
