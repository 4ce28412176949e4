"""Options users carry over from other embedding classes and servers (LangChain's ``HuggingFaceEmbeddings``,
LlamaIndex's ``HuggingFaceEmbedding``, sentence-transformers' ``encode``), and what to use here instead: a framework
object refuses such an option in one sentence that names its replacement (docs/migrating.md maps the rest).

Imports: nothing of the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# option -> what this package takes instead (a sentence's second half).
FOREIGN_OPTIONS: dict[str, str] = {
    "model_kwargs": (
        "pass device=, dtype=, revision=, trust_remote_code= and cache_folder= as fields of their own, and vLLM "
        "engine arguments as engine_kwargs="
    ),
    "encode_kwargs": (
        "pass normalize=, batch_size= (LlamaIndex: embed_batch_size=), precision= and query_instruction=/"
        "document_instruction= (LlamaIndex: text_instruction=) as fields of their own"
    ),
    "query_encode_kwargs": "pass query_instruction= (the query's prompt) and normalize= as fields of their own",
    "multi_process": (
        "one engine batches every caller's texts by itself; for several NPUs use rbln_retrieval.ray or one "
        "`rbln-retrieval serve` per device with base_url=[...]"
    ),
    "parallel_process": "one engine batches every caller's texts by itself; for several NPUs use rbln_retrieval.ray",
    "target_devices": (
        "device= picks 'rbln', 'cpu' or 'auto'; RBLN_VISIBLE_DEVICES picks the NPUs, rbln_retrieval.ray spreads "
        "over several"
    ),
    "pooling": "pooling is read from the model's files (1_Pooling/config.json); family= overrides the family",
    "tokenizer_name": "the tokenizer is the model's own (model= names both)",
    "local_files_only": "set HF_HUB_OFFLINE=1, or pass a local model directory as the model",
    "backend": "the engine is vLLM's, on an RBLN NPU or the CPU (device=)",
    "normalize_embeddings": "pass normalize=",
    "prompt_name": "pass query_instruction= or document_instruction= (LlamaIndex: text_instruction=)",
}


def refuse_foreign_options(owner: str, data: Any) -> None:
    """Raise ValueError for the first option in ``data`` (a constructor's keyword arguments) that belongs to another
    library, naming what ``owner`` takes instead."""
    if not isinstance(data, Mapping):
        return
    for name in data:
        if name in FOREIGN_OPTIONS:
            raise ValueError(f"{owner} has no option {name!r}: {FOREIGN_OPTIONS[name]}.")
