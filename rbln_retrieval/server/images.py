"""Images in requests, checked before vLLM sees them: chat-style ``messages`` (or chat ``input``) whose content parts
carry an ``image_url``, as vLLM's /v1/embeddings (and /pooling, /invocations) take them for CLIP and SigLIP.

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

# Where a request carries chat conversations (vLLM's chat embeddings request and its `input` form).
CHAT_FIELDS = ("messages", "input")


def image_urls(request: Any) -> Iterator[tuple[str, int, Any]]:
    """(field, index, url) of every image part of ``request``: index is the conversation's in a batch of them, else
    the message's in the one conversation."""
    for field in CHAT_FIELDS:
        value = request.get(field)
        if not isinstance(value, list):
            continue
        batched = bool(value) and all(isinstance(item, list) for item in value)
        for index, item in enumerate(value):
            for message in item if batched else [item]:
                content = message.get("content") if isinstance(message, dict) else None
                for part in content if isinstance(content, list) else []:
                    if isinstance(part, dict) and "image_url" in part:
                        url = part["image_url"]
                        yield field, index, url.get("url") if isinstance(url, dict) else url


def image_refusal(request: Any, *, model: str, family: dict[str, Any], allowed_domains: list[str]) -> str | None:
    """The sentence refusing the first bad image of ``request`` (a parsed JSON body), or None."""
    for field, index, url in image_urls(request):
        name = f"{field}[{index}]"
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
    body with images is parsed (again) and decoded, off the event loop."""

    def __init__(self, *, model: str, family: dict[str, Any], allowed_domains: list[str] | None):
        self.model, self.family, self.allowed_domains = model, family, list(allowed_domains or [])

    async def __call__(self, body: bytes) -> str | None:
        return await asyncio.to_thread(self._refusal, body) if b"image_url" in body else None

    def _refusal(self, body: bytes) -> str | None:
        try:
            request = json.loads(body)
        except ValueError:
            return None  # vLLM answers a body that is not JSON itself
        if not isinstance(request, dict):
            return None
        return image_refusal(request, model=self.model, family=self.family, allowed_domains=self.allowed_domains)
