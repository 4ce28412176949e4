"""Caller images -> checked RGB PIL images, the input step of image-text models (models/specs/image_text.py).

An image is a PIL image, a file path as ``pathlib.Path`` (any ``os.PathLike``), the encoded bytes of a file
(``bytes``, ``bytearray``, ``memoryview``) or a binary file object (``io.BytesIO``). A ``str`` is never guessed to
be a path (nor a URL): it is refused, so a caller who meant a caption gets an error rather than a file read. Every
image is decoded in full here, so a file that is not an image, a truncated one, one over ``MAX_PIXELS`` or one whose
mode has no RGB meaning is refused in one sentence naming it, before the engine (or a server, to which
``encoded_image`` gives the bytes to send) sees any of the call. RGB conversion is transformers' own
``convert_to_rgb``, the step the image-text families' processors start with (``do_convert_rgb``); resizing and
normalisation are left to the model's own processor, which vLLM runs.

Imports: nothing of the package; PIL and transformers (deferred).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# The largest image decoded (PIL's own guard against decompression bombs is 89 megapixels): a model's processor
# shrinks every image to a few hundred pixels a side, so a bigger one is almost surely a mistake or an attack.
MAX_PIXELS = 50_000_000
# Modes whose pixels have no defined meaning as 8-bit RGB (16-bit and 32-bit integer, float): converting them would
# saturate values silently, so they are refused.
_NO_RGB_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")
CHUNK_SIZE = 256


def _describe(item: Any, index: int, what: str) -> str:
    if isinstance(item, os.PathLike):
        return f"{what}[{index}] ({os.fspath(item)})"
    return f"{what}[{index}]"


def load_image(item: Any, index: int = 0, what: str = "images") -> Any:
    """``item`` as a fully decoded RGB ``PIL.Image.Image``; TypeError or ValueError naming ``what[index]``."""
    from transformers.image_transforms import convert_to_rgb

    return convert_to_rgb(_decoded(item, _describe(item, index, what))[0])


def encoded_image(item: Any, index: int = 0, what: str = "images") -> tuple[str, bytes]:
    """``item`` checked as load_image checks it, as (MIME type, file bytes) from which vLLM's server takes the
    pixels an in-process vLLM engine takes from load_image's image: the caller's own file when it is stored as RGB
    (a JPEG photo stays its compressed size; vLLM treats the decoded file as it treats that image), else a PNG of
    load_image's image turned upright by its EXIF orientation (as vLLM turns every image it is given, which the
    PNG no longer records)."""
    from PIL import Image, ImageOps
    from transformers.image_transforms import convert_to_rgb

    image, raw = _decoded(item, _describe(item, index, what))
    if raw is not None and image.mode == "RGB" and image.format in Image.MIME:
        return Image.MIME[image.format], raw
    rgb: Any = convert_to_rgb(image)
    with contextlib.suppress(Exception):  # as vLLM's own normalize_image: an unreadable orientation is ignored
        rgb = ImageOps.exif_transpose(rgb)
    out = io.BytesIO()
    rgb.save(out, format="PNG", compress_level=1)
    return "image/png", out.getvalue()


def _decoded(item: Any, name: str) -> tuple[Any, bytes | None]:
    """(the decoded image in its own mode, the file's bytes; None for a PIL image), every check of load_image's."""
    from PIL import Image, UnidentifiedImageError

    raw: bytes | None = None
    if isinstance(item, str):
        raise TypeError(
            f"{name} is a str; pass pathlib.Path(...) for an image file or the image's bytes (a string is never "
            "taken for a path)."
        )
    if isinstance(item, Image.Image):
        image = item
    else:
        if isinstance(item, os.PathLike):
            try:
                raw = Path(item).read_bytes()
            except OSError as exc:
                raise ValueError(f"{name} cannot be read: {exc.strerror or exc}.") from exc
        elif isinstance(item, (bytes, bytearray, memoryview)):
            raw = bytes(item)
        elif hasattr(item, "read"):
            raw = item.read()
        else:
            raise TypeError(
                f"{name} is {type(item).__name__}; expected a PIL image, a pathlib.Path, bytes or a binary file object."
            )
        try:
            image = Image.open(io.BytesIO(raw))
        except UnidentifiedImageError:
            raise ValueError(f"{name} is not an image file PIL can decode.") from None
        except Image.DecompressionBombError:  # PIL refuses it at open, before our own bound below
            raise ValueError(f"{name} is over the limit of {MAX_PIXELS:,} pixels (a decompression bomb).") from None
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise ValueError(f"{name} is {width}x{height} pixels, over the limit of {MAX_PIXELS:,} pixels.")
    if width == 0 or height == 0:
        raise ValueError(f"{name} has no pixels ({width}x{height}).")
    if image.mode in _NO_RGB_MODES:
        raise ValueError(f"{name} has mode {image.mode!r} (16-bit or float pixels), which has no defined RGB form.")
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as exc:  # PIL's decoders report truncation and corruption as these
        raise ValueError(f"{name} is truncated or corrupt ({exc}).") from None
    return image, raw


def image_chunks(images: Iterable[Any], what: str = "images") -> Iterator[tuple[int, list[Any]]]:
    """(index of the first item, the chunk's items) pairs over an iterable of images; a lone image or a str in place
    of the iterable is refused."""
    if isinstance(images, (str, bytes, bytearray, memoryview, os.PathLike)):
        raise TypeError(f"{what} is a single {type(images).__name__}; pass a list of images.")
    if hasattr(images, "getpixel"):  # a PIL image is iterable over nothing useful
        raise TypeError(f"{what} is a single image; pass a list of images.")
    if not isinstance(images, Iterable):
        raise TypeError(f"{what} is {type(images).__name__}, expected an iterable of images.")
    iterator = iter(images)
    first = 0
    while chunk := list(itertools.islice(iterator, CHUNK_SIZE)):
        yield first, chunk
        first += len(chunk)


def load_images(items: list[Any], *, first_index: int = 0, what: str = "images") -> list[Any]:
    return [load_image(item, first_index + i, what) for i, item in enumerate(items)]


def framework_images(uris: Iterable[Any], what: str = "uris") -> list[Any]:
    """The images a framework names (LangChain's ``embed_image(uris)``, LlamaIndex's image paths): there a str is a
    file path by the framework's contract (a ``file://`` URL too), so it becomes a ``pathlib.Path``; other images
    pass as they are."""
    if isinstance(uris, str):
        raise TypeError(f"{what} is a single str; pass a list of image file paths.")
    images: list[Any] = []
    for index, uri in enumerate(uris):
        if isinstance(uri, str):
            scheme, sep, rest = uri.partition("://")
            if sep and scheme != "file":
                raise ValueError(f"{what}[{index}] is a {scheme}:// URL; pass a local file path (nothing is fetched).")
            images.append(Path(rest if sep else uri))
        else:
            images.append(uri)
    return images
