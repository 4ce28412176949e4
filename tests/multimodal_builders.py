"""Tiny random-weight image-text models (CLIP, SigLIP) with offline processors, and their transformers references.

Each builder writes a complete model directory: config, safetensors weights, a tokenizer made here (no download:
CLIP's byte-level BPE with an alphabet-only vocabulary, SigLIP's sentencepiece model trained in memory) and the
family's own image processor at a toy image size. The references run transformers' own ``get_image_features`` /
``get_text_features`` with the model's own processor, one input at a time.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SIZE = 32
PATCH = 8
WIDTH = 32  # hidden size of both towers; vLLM's CLIP needs the text width <= projection_dim
HEADS = 1  # head_dim 32: vLLM's CPU attention rejects 16


def _tower(**extra: Any) -> dict[str, Any]:
    return dict(hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2, num_attention_heads=HEADS, **extra)


def clip_tokenizer(path: Path) -> Any:
    """CLIP's BPE with every byte-level character (and its end-of-word form) and no merges: words tokenize into
    characters. The special tokens come last: vLLM's CLIP uses id 0 as the image placeholder."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    tokens = alphabet + [c + "</w>" for c in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={token: i for i, token in enumerate(tokens)}, merges=[])


def siglip_tokenizer(path: Path, max_length: int) -> Any:
    """A sentencepiece model trained here on a few sentences (SigLIP's tokenizer is sentencepiece)."""
    import sentencepiece as spm
    from transformers import SiglipTokenizer

    sentences = [
        "a photo of a cat",
        "a photo of a dog",
        "the quick brown fox jumps over the lazy dog",
        "red green blue image pixels",
        "Paris is the capital of France",
    ] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=40,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (path / "spiece.model").write_bytes(model.getvalue())
    return SiglipTokenizer(vocab_file=str(path / "spiece.model"), model_max_length=max_length)


def build_clip(path: str | Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = clip_tokenizer(path)
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = CLIPConfig(
        text_config=_tower(
            vocab_size=len(tokenizer),
            max_position_embeddings=77,
            projection_dim=WIDTH,
            pad_token_id=tokenizer.pad_token_id,
            **special,
        ),
        vision_config=_tower(image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=WIDTH),
        projection_dim=WIDTH,
    )
    CLIPModel(config).save_pretrained(str(path))
    images = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(str(path))
    return path


SIGLIP_TEXT_LENGTH = 16


def build_siglip(path: str | Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = siglip_tokenizer(path, SIGLIP_TEXT_LENGTH)
    config = SiglipConfig(
        text_config=_tower(
            vocab_size=len(tokenizer),
            max_position_embeddings=SIGLIP_TEXT_LENGTH,
            projection_size=WIDTH,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=_tower(image_size=IMAGE_SIZE, patch_size=PATCH),
    )
    SiglipModel(config).save_pretrained(str(path))
    images = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    SiglipProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(str(path))
    return path


def sample_images(count: int, *, seed: int = 0) -> list[Any]:
    """RGB images of assorted sizes (the processor resizes and crops them to the model's size)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(48, 40), (32, 32), (64, 96), (40, 33), (100, 50)]
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        for w, h in (sizes[i % len(sizes)] for i in range(count))
    ]


def write_images(root: Path, count: int, *, seed: int = 0) -> list[str]:
    """``count`` sample images as PNG files under ``root``; their paths as str (the frameworks' convention)."""
    files = []
    for i, image in enumerate(sample_images(count, seed=seed)):
        (root / f"{i}.png").write_bytes(png_bytes(image))
        files.append(str(root / f"{i}.png"))
    return files


def png_bytes(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _features(output: Any) -> Any:
    # transformers 5 returns a model output whose pooler_output holds the projected features; 4.x a tensor.
    return getattr(output, "pooler_output", output)


def reference_images(path: str | Path, images: list[Any]) -> np.ndarray:
    """transformers' own image features (normalized), each image through the model's own processor."""
    import torch
    from transformers import AutoModel, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for image in images:
            pixels = processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
            rows.append(_features(model.get_image_features(pixel_values=pixels))[0])
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


def reference_texts(path: str | Path, texts: list[str]) -> np.ndarray:
    """transformers' own text features (normalized), tokenized as the family's processor does for retrieval
    (SigLIP: padded to max_length, which its pooling of the last position depends on)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    pad = model.config.model_type == "siglip"
    rows = []
    with torch.no_grad():
        for text in texts:
            kwargs = {"padding": "max_length", "max_length": SIGLIP_TEXT_LENGTH, "truncation": True} if pad else {}
            ids = tokenizer(text, return_tensors="pt", **kwargs)["input_ids"]
            rows.append(_features(model.get_text_features(input_ids=ids))[0])
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


COLPALI_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # the page's patches: SigLIP's image_seq_length
COLPALI_DIM = 32


def colpali_tokenizer() -> Any:
    """Gemma's byte-fallback BPE over printable ASCII with no merges (words tokenize into characters), with the
    literal "\\n" token PaliGemma's prompts end with."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    alphabet = ["\n", "\u2581", *(chr(c) for c in range(33, 127))]
    return GemmaTokenizer(vocab={token: i for i, token in enumerate(specials + alphabet)}, merges=[])


def build_colpali(path: str | Path, *, seed: int = 0) -> Path:
    """A ColPaliForRetrieval: PaliGemma with a SigLIP vision tower and a Gemma text model, its projection with the
    bias the checkpoints carry, and ColPali's own processor (its page prompt and query template)."""
    import torch
    from transformers import ColPaliConfig, ColPaliForRetrieval, ColPaliProcessor, PaliGemmaConfig
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    images = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    images.image_seq_length = COLPALI_IMAGE_TOKENS
    processor = ColPaliProcessor(image_processor=images, tokenizer=colpali_tokenizer())
    tokenizer = processor.tokenizer
    text_width = 64
    vlm = PaliGemmaConfig(
        vision_config=dict(
            model_type="siglip_vision_model",
            vision_use_head=False,  # PaliGemma reads the tower's last hidden states
            **_tower(image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=text_width),
        ),
        text_config=dict(
            model_type="gemma",
            vocab_size=len(tokenizer),
            hidden_size=text_width,
            intermediate_size=2 * text_width,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=128,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        image_token_index=processor.image_token_id,
        projection_dim=text_width,
        hidden_size=text_width,
    )
    model = ColPaliForRetrieval(ColPaliConfig(vlm_config=vlm, embedding_dim=COLPALI_DIM))
    with torch.no_grad():  # random weights leave the bias at zero: a bias the engine dropped would go unseen
        model.embedding_proj_layer.bias.normal_(0.0, 0.5)
    model.save_pretrained(str(path))
    processor.save_pretrained(str(path))
    return path


def reference_colpali(
    path: str | Path, *, images: list[Any] | None = None, queries: list[str] | None = None
) -> list[Any]:
    """transformers' own ColPaliForRetrieval embeddings, one page or query at a time through the model's
    ColPaliProcessor (``process_images`` / ``process_queries``): one float32 (tokens, dim) array each."""
    import torch
    from transformers import ColPaliForRetrieval, ColPaliProcessor

    processor = ColPaliProcessor.from_pretrained(str(path))
    model = ColPaliForRetrieval.from_pretrained(str(path), dtype=torch.float32).eval()
    batches = [processor.process_images(images=[image.convert("RGB")]) for image in images or []]
    batches += [processor.process_queries(text=[query]) for query in queries or []]
    with torch.no_grad():
        return [model(**batch).embeddings[0].numpy() for batch in batches]
