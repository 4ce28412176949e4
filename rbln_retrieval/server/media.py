"""The one check of the media a request carries, whatever its route or field: OpenAI chat ``messages``' image
parts, Cohere's ``images`` and ``inputs`` content, this package's own ``images``. Routes hand their items here as
(name, URL) pairs and get decoded images back, or a Refused naming the item.

An image travels as a ``data:image/...;base64,`` URL. Before anything is decoded, each image's header is read for its
size: an image over MAX_PIXELS (a decompression bomb: a few KB of PNG that would decode to gigabytes) is refused 413
naming it, and so is a request whose images add up to over MAX_REQUEST_PIXELS. Only then is each decoded, with the
local engine's own checks (rbln_retrieval.text.images: not an image, truncated, 16-bit or float pixels).

Remote media is not fetched: an http(s) URL is refused in one sentence and no connection is made, unless the server
was started with ``allowed_domains`` naming the URL's host. Then the server fetches it itself (never vLLM's media
connector), without following redirects blindly: every hop's host must be an allowed domain whose addresses are all
public (loopback, private, link-local, multicast and reserved addresses are refused), at most MAX_REDIRECTS hops, at
most MAX_FETCH_BYTES read. Each hop's host is resolved once and the connection goes to the address checked, with the
host name kept in the Host header and the TLS server name (so its certificate is verified for the name): a name that
resolves to a public address when checked and to a private one when connecting (DNS rebinding) reaches only the
public one. Any other scheme (``file:``, ...) is always refused: the server never reads what a request
points at. A text model's server refuses images in one sentence.

Imports: models (families, multimodal), server (check), text (images); httpx inside the fetch; the standard library.
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import socket
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.specs.image_text import texts_only
from rbln_retrieval.server.check import Refused
from rbln_retrieval.text.images import MAX_PIXELS, load_image

# All images of one request, in pixels: four images at the per-image bound.
MAX_REQUEST_PIXELS = 4 * MAX_PIXELS
MAX_REDIRECTS = 3
MAX_FETCH_BYTES = 16_000_000
FETCH_TIMEOUT_SECONDS = 10.0

# host -> its addresses; a parameter so tests resolve names without DNS.
Resolver = Callable[[str], list[str]]


def resolve(host: str) -> list[str]:
    """Every address ``host`` resolves to (an IP literal: itself)."""
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []


class MediaCheck:
    """The media policy of one server: which hosts it may fetch from (none by default) and how names resolve."""

    def __init__(self, allowed_domains: list[str] | None = None, resolver: Resolver = resolve):
        self.allowed_domains = {domain.lower() for domain in allowed_domains or []}
        self.resolver = resolver

    def images(self, items: list[tuple[str, Any]], *, family: ModelFamily, model: str) -> list[Any]:
        """The decoded images of ``items`` ((name, URL) pairs), every header checked before any is decoded."""
        if items and not family.embeds_images:
            raise Refused(f"{items[0][0]} holds an image, but {texts_only(model, family.name)}", "wrong_model")
        raws = [(name, self.image_bytes(url, name)) for name, url in items]
        total = 0
        for name, raw in raws:
            total += image_pixels(raw, name)
            if total > MAX_REQUEST_PIXELS:
                raise Refused(
                    f"The request's images up to {name} hold over {MAX_REQUEST_PIXELS:,} pixels; send fewer or "
                    "smaller images in one request.",
                    "too_large",
                )
        images = []
        for index, (name, raw) in enumerate(raws):
            try:
                images.append(load_image(raw, index, name))
            except (TypeError, ValueError) as exc:
                raise Refused(str(exc).replace(f"{name}[{index}]", name)) from None
        return images

    def image_bytes(self, url: Any, name: str) -> bytes:
        """The file bytes of the image at ``url`` (a data URL, or an allowed remote URL)."""
        if not isinstance(url, str):
            raise Refused(f"{name} is {type(url).__name__}; send the image as a data:image/...;base64, URL.")
        scheme = url.partition(":")[0].lower()
        if scheme in ("http", "https") and self.allowed_domains:
            return self._fetch(url, name)
        if scheme != "data":
            return _refuse_url(name, scheme)
        return data_url_bytes(url, name)

    def _fetch(self, url: str, name: str) -> bytes:
        import httpx

        with httpx.Client(follow_redirects=False, timeout=FETCH_TIMEOUT_SECONDS, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                address = self._check_target(url, name)
                target = httpx.URL(url)
                pinned = target.copy_with(host=address)
                headers = {"Host": target.netloc.decode("ascii")}
                with client.stream(
                    "GET", pinned, headers=headers, extensions={"sni_hostname": target.host}
                ) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    if response.status_code != 200:
                        raise Refused(f"{name}'s URL answered HTTP {response.status_code}, not an image.")
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > MAX_FETCH_BYTES:
                            raise Refused(f"{name}'s URL sends over {MAX_FETCH_BYTES:,} bytes.", "too_large")
                    return bytes(data)
        raise Refused(f"{name}'s URL redirects more than {MAX_REDIRECTS} times.")

    def _check_target(self, url: str, name: str) -> str:
        """The address to connect to for a hop, once its scheme, host and every address of the host (resolved
        here, once) are allowed; else Refused."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https"):
            _refuse_url(name, parts.scheme)
        if host not in self.allowed_domains:
            raise Refused(f"{name} points at {host or 'no host'}, which is not among the server's allowed domains.")
        addresses = self.resolver(host)
        if not addresses:
            raise Refused(f"{name}'s host {host} does not resolve.")
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%")[0])
            if not ip.is_global or ip.is_multicast:
                raise Refused(
                    f"{name}'s host {host} resolves to {ip}, a loopback, private, link-local or reserved address, "
                    "which the server never fetches from."
                )
        return addresses[0].split("%")[0]


def _refuse_url(name: str, scheme: str) -> bytes:
    raise Refused(
        f"{name} is a {scheme or 'schemeless'} URL, which this server does not fetch; send the image itself as a "
        "data:image/...;base64, URL."
    )


def data_url_bytes(url: str, name: str) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL; else Refused naming it."""
    header, comma, data = url[len("data:") :].partition(",")
    media_type, *params = header.split(";")
    if not comma or "base64" not in params:
        raise Refused(f"{name} is a data URL without base64 data; send data:image/...;base64,<the image file's bytes>.")
    if not media_type.lower().startswith("image/"):
        raise Refused(f"{name} is a data URL of {media_type or 'no media type'}, not an image.")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(f"{name}'s data URL is not valid base64.") from None


def image_pixels(raw: bytes, name: str) -> int:
    """The pixels of the image file ``raw``, read from its header alone; an image over MAX_PIXELS is Refused."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            width, height = Image.open(io.BytesIO(raw)).size
    except Image.DecompressionBombError:
        raise Refused(
            f"{name} is over the limit of {MAX_PIXELS:,} pixels (a decompression bomb).", "too_large"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise Refused(f"{name} is not an image file PIL can decode.") from None
    if width * height > MAX_PIXELS:
        raise Refused(f"{name} is {width}x{height} pixels, over the limit of {MAX_PIXELS:,} pixels.", "too_large")
    return int(width * height)
