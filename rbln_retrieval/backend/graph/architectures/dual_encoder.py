"""Image models on traced targets: the vision tower as static graphs, one per image-count bucket (CLIP, SigLIP and
ColPali), and the image-text models' (CLIP, SigLIP) text tower's step without vLLM's host-synchronising branches.

vLLM runs a dual encoder's vision tower eagerly before each step (``embed_multimodal``), then its forward merges text
and image vectors by branches on the step's values (``_has_text_tokens``, ``is_multimodal.any().item()``, SigLIP's
sequences found by ``torch.where`` on the host to flip them). Here:

- ``VisionGraphs``: the tower, its pooling and projection (vLLM's ``get_image_features``: the image_embeds of
  transformers' ``get_image_features``; for ColPali the SigLIP tower and PaliGemma's projector, the image tokens'
  input embeddings, ``colpali``) at the model's fixed image size, one graph per image-count bucket. A step's
  images are padded to the next bucket with zero images whose rows are dropped; more than the largest bucket holds
  go through it in turns. Pixels enter flattened (``3 x size x size`` values per image, zero-padded to a multiple
  of 64) and are reshaped in the graph.
- ``text_step``: the text tower over the whole step; image slots take their vectors by ``torch.where`` on a mask
  input; SigLIP's flip is a gather by int32 indices the host computes from the step's layout (``step_inputs``).

May import: the standard library, numpy, torch, ``compile`` (this stage), ``rbln_retrieval.backend.vllm_compat``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from rbln_retrieval.backend.graph.compile import GraphCost, RecordingBackend, count_flops, strict_errors
from rbln_retrieval.backend.vllm_compat import DualEncoderText

IMAGE_BUCKETS = (1, 8)  # images per vision graph: a lone image, and a step's worth
ALIGN = 64  # the NPU's tile: graph inputs' last dimensions are multiples of it


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def vision_label(bucket: int) -> str:
    return f"images {bucket}"


@dataclass
class VisionGraphs:
    """The vision tower's graphs: ``features`` (pixels ``[n, 3, size, size]`` -> image_embeds, or ColPali's
    ``[n, image tokens, hidden]``) per bucket."""

    features: Callable[[torch.Tensor], torch.Tensor]
    image_size: int
    dtype: torch.dtype
    buckets: tuple[int, ...] = IMAGE_BUCKETS
    compiled: Callable[[torch.Tensor], torch.Tensor] | None = None  # set by the runner: ``forward``, compiled
    recorder: RecordingBackend | None = None
    costs: dict[str, GraphCost] = field(default_factory=dict)  # per bucket label, counted at its first call
    calls: Counter = field(default_factory=Counter)  # graph calls per bucket
    images: int = 0

    @property
    def values(self) -> int:
        return 3 * self.image_size * self.image_size

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The graph: ``[bucket, aligned values]`` flattened pixels -> ``[bucket, ...]`` features."""
        size = self.image_size
        return self.features(pixels[:, : self.values].reshape(pixels.shape[0], 3, size, size))

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if tuple(pixel_values.shape[1:]) != (3, self.image_size, self.image_size):
            raise ValueError(
                f"The vision graphs take images of 3x{self.image_size}x{self.image_size}; the processor gave "
                f"{tuple(pixel_values.shape[1:])}."
            )
        out = []
        for start in range(0, len(pixel_values), self.buckets[-1]):
            chunk = pixel_values[start : start + self.buckets[-1]]
            out.append(self._run(chunk.reshape(len(chunk), -1).to(self.dtype))[: len(chunk)])
        self.images += len(pixel_values)
        return torch.cat(out)

    def _run(self, flat: torch.Tensor) -> torch.Tensor:
        bucket = next(b for b in self.buckets if b >= len(flat))
        pixels = torch.zeros(bucket, _aligned(self.values), dtype=self.dtype)
        pixels[: len(flat), : self.values] = flat
        label = vision_label(bucket)
        if label not in self.costs:
            self.costs[label] = count_flops(self.forward, pixels)
        if self.recorder is not None:
            self.recorder.current_bucket = label
        self.calls[label] += 1
        with strict_errors():
            return (self.compiled or self.forward)(pixels)

    def warm_up(self) -> None:
        """One call per bucket (zero images), so nothing compiles while serving; in inference mode, as vLLM's
        runner calls the tower (a graph compiled under another grad mode would be compiled again)."""
        with torch.inference_mode():
            for bucket in self.buckets:
                self(torch.zeros(bucket, 3, self.image_size, self.image_size, dtype=self.dtype))
        self.calls.clear()
        self.images = 0

    def describe(self) -> dict[str, object]:
        """What ``stats()`` reports: the fixed image size, the buckets, images embedded and graph calls per bucket."""
        return {
            "image_size": self.image_size,
            "buckets": [vision_label(b) for b in self.buckets],
            "input_shapes": {vision_label(b): [b, _aligned(self.values)] for b in self.buckets},
            "images": self.images,
            "calls_per_bucket": dict(sorted(self.calls.items())),
        }


def text_step(
    text: DualEncoderText,
    positions: torch.Tensor,
    embeds: torch.Tensor,
    is_image: torch.Tensor,
    flip: torch.Tensor | None,
) -> torch.Tensor:
    """One packed step of a dual encoder, in the graph: the text tower over every slot, then each image slot's
    own vector (its first columns of ``embeds``) in place of the text tower's row."""
    features = text.features(positions, embeds[:, : text.width])
    if flip is not None:
        features = features.index_select(0, flip)
    return torch.where(is_image.unsqueeze(-1), embeds[:, : features.shape[-1]], features)


def step_inputs(
    text: DualEncoderText,
    mask: torch.Tensor | None,
    source: np.ndarray | None,
    starts: np.ndarray,
    lengths: np.ndarray,
    tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The host's part of a step: which slots hold an image (vLLM's token mask, in slot order; ``source``: the
    row layout's gather, None without one) and, for SigLIP, each slot's source in its prompt reversed."""
    is_image = torch.zeros(tokens, dtype=torch.bool)
    if mask is not None:
        is_image[: len(mask)] = mask
        if source is not None:
            is_image = is_image[torch.from_numpy(source)]
    if not text.flips:
        return is_image, None
    flip = np.arange(tokens, dtype=np.int32)
    for start, length in zip(starts.tolist(), lengths.tolist()):
        flip[start : start + length] = np.arange(start + length - 1, start - 1, -1, dtype=np.int32)
    return is_image, torch.from_numpy(flip)


def pad_width(embeds: torch.Tensor) -> torch.Tensor:
    """``embeds`` with its last dimension zero-padded to a multiple of 64 (the graph reads its first columns)."""
    extra = _aligned(embeds.shape[-1]) - embeds.shape[-1]
    return torch.nn.functional.pad(embeds, (0, extra)) if extra else embeds
