"""What a model directory holds, read without loading the model: its JSON files, the sentence-transformers modules
(pooling, Dense layers), and whether its weights are safe to load.

Imports: errors; safetensors inside the checks that read weights; the standard library (hashlib).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Literal

from rbln_retrieval.errors import ModelNotSupportedError

Pooling = Literal["MEAN", "CLS", "LAST"]

_ST_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
    "pooling_mode_lasttoken": "LAST",
}
_ST_POOLING_MODES: dict[str, Pooling] = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}


def read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        data: dict[str, Any] | list[Any] = json.load(f)
    return data


def sentence_transformers_modules(model_dir: Path) -> list[dict[str, Any]]:
    modules = read_json(model_dir / "modules.json")
    return modules if isinstance(modules, list) else []


def st_pooling(model_dir: Path, modules: list[dict[str, Any]]) -> Pooling | None:
    pooling_dirs = [m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")]
    for sub in pooling_dirs or ["1_Pooling"]:
        cfg = read_json(model_dir / sub / "config.json")
        if not isinstance(cfg, dict):
            continue
        if mode := cfg.get("pooling_mode"):  # newer sentence-transformers writes one string
            return _ST_POOLING_MODES.get(mode)
        for flag, pooling in _ST_POOLING_FLAGS.items():
            if cfg.get(flag):
                return pooling
    return None


# Activations of sentence-transformers' Dense module that vLLM's projector applies (`get_act_fn`).
_DENSE_ACTIVATIONS = {"torch.nn.modules.linear.Identity", "torch.nn.modules.activation.Tanh"}
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def dense_output_width(model_dir: Path, modules: list[dict[str, Any]], hidden_size: int) -> int:
    """The vector width after the sentence-transformers Dense layers, each checked to be one vLLM loads (vLLM
    skips a Dense layer it cannot read, which would silently change the vectors)."""
    width = hidden_size
    for module in modules:
        if not module.get("type", "").endswith("Dense"):
            continue
        folder = module.get("path", "")
        dense = read_json(model_dir / folder / "config.json")
        if not isinstance(dense, dict) or not any((model_dir / folder / name).is_file() for name in DENSE_WEIGHTS):
            raise ModelNotSupportedError(
                f"{model_dir}'s Dense module {folder!r} lacks its config.json or its weights "
                f"({' or '.join(DENSE_WEIGHTS)})."
            )
        activation = dense.get("activation_function", "torch.nn.modules.activation.Tanh")
        if activation not in _DENSE_ACTIVATIONS:
            raise ModelNotSupportedError(
                f"{model_dir}'s Dense module {folder!r} uses activation {activation}; only Identity and Tanh run."
            )
        if dense.get("in_features") != width:
            raise ModelNotSupportedError(
                f"{model_dir}'s Dense module {folder!r} takes {dense.get('in_features')} features, not {width}."
            )
        width = int(dense["out_features"])
    return width


def is_pylate(model_dir: Path, modules: list[dict[str, Any]]) -> bool:
    st_config = read_json(model_dir / "config_sentence_transformers.json")
    prefixes = isinstance(st_config, dict) and ("query_prefix" in st_config or "document_prefix" in st_config)
    return prefixes or any(m.get("type", "").startswith("pylate.") for m in modules)


def check_weights(model_dir: str | Path, *, allow_pickle: bool) -> None:
    """Refuse pickle-only checkpoints (loading them can run arbitrary code) unless the caller trusts them."""
    model_dir = Path(model_dir)
    if not allow_pickle:
        _check_dense_weights(model_dir)
    if allow_pickle or any(model_dir.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickles:
        raise ModelNotSupportedError(
            f"{model_dir} has only pickle weights ({', '.join(pickles)}), which can run code when loaded; "
            "convert them to safetensors or pass allow_pickle=True if you trust the source."
        )
    raise ModelNotSupportedError(f"{model_dir} has no weights (*.safetensors).")


def _check_dense_weights(model_dir: Path) -> None:
    """sentence-transformers Dense layers saved only as pickles are refused like pickle-only model weights."""
    for module in sentence_transformers_modules(model_dir):
        folder = model_dir / module.get("path", "")
        safetensors, pickle = (folder / name for name in DENSE_WEIGHTS)
        if module.get("type", "").endswith("Dense") and not safetensors.is_file() and pickle.is_file():
            raise ModelNotSupportedError(
                f"{model_dir}'s Dense module {module.get('path')!r} has only pickle weights ({DENSE_WEIGHTS[1]}), "
                "which can run code when loaded; convert them to safetensors or pass allow_pickle=True if you "
                "trust the source."
            )


def unreadable_weights(model_dir: str) -> str | None:
    """One sentence naming a safetensors file whose header cannot be read, or None when all of them can."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(path, framework="numpy"):
                pass
        except (SafetensorError, OSError) as exc:
            return f"{path.name} is not a readable safetensors file ({exc})."
    return None


# The files whose names, sizes and (for safetensors and the index) headers identify a snapshot's weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# A safetensors header is at most this long (the format's own bound is 100 MB; real headers are kilobytes).
MAX_HEADER_BYTES = 100_000_000


def weights_fingerprint(model_dir: str | Path) -> str:
    """A digest identifying the weights of ``model_dir``: every weight file's relative path and size, the weight
    index, and each safetensors file's header (its tensors' names, dtypes, shapes and offsets), read without the
    tensors themselves, so replicas serving different snapshots differ while copies of one agree."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name in WEIGHT_INDEXES)
    )
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
        if path.name in WEIGHT_INDEXES:
            digest.update(path.read_bytes())
        elif path.suffix == ".safetensors":
            digest.update(_safetensors_header(path))
    return "sha256:" + digest.hexdigest()


def _safetensors_header(path: Path) -> bytes:
    """The JSON header of a safetensors file (empty for a file too short or malformed to have one)."""
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return b""
        (length,) = struct.unpack("<Q", prefix)
        return f.read(length) if length <= MAX_HEADER_BYTES else b""
