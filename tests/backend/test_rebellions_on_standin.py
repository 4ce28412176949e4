"""Rebellions' own code, unmodified, on the stand-in compiler (tests/standin): optimum-rbln 0.12's encoders exported,
saved, loaded and run in this process, and vllm-rbln 0.12's pooling engine (only its plugins loaded, as on an NPU
host) in one subprocess per model (tests/vllm_rbln_run.py). These fail when the stand-in's API drifts from what
Rebellions' code calls (device queries, the ``compile`` signature probe, ``compile_from_torch`` with one or several
``input_info`` buckets, ``Runtime(..., tensor_type="pt", device=, activate_profiler=, timeout=)``, calls by position
and by name). Rebellions' graphs are judged by the SDK's rules (``rebel.rules``); ours keep the stricter ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import reference
import torch
from vllm_rbln_run import run

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Paris is the capital of France.", "hello", "A longer passage about the Rhine, which flows through Basel."]
QUERY, DOCUMENTS = "Where is Paris?", ["Paris is the capital of France.", "Berlin is in Germany.", "Rhine"]


class TakesIds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(100, 64)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids).sum(1)


def test_int64_inputs_are_the_sdks_and_refused_only_under_this_packages_rules(standin_rebel):
    import rebel
    from rebel import rules

    module, info = TakesIds().eval(), [("input_ids", [2, 64], "int64")]
    with pytest.raises(standin_rebel.GraphContractError, match=r"input input_ids has dtype torch\.int64"):
        rebel.compile_from_torch(module, input_info=info, num_devices=1)
    with rules.rules_for("sdk"):
        model = rebel.compile_from_torch(module, input_info=info, num_devices=1)
    ids = torch.randint(0, 100, (2, 64))
    torch.testing.assert_close(rebel.Runtime(model, tensor_type="pt")(ids), module(ids), rtol=0, atol=0)
    assert rules.table() in (ROOT / "docs" / "rbln.md").read_text(), "docs/rbln.md carries the stand-in's rules"


def test_the_device_queries_optimum_and_vllm_rbln_make(standin_rebel, monkeypatch):
    import inspect

    import rebel

    monkeypatch.setenv("REBEL_STANDIN_DEVICES", "2")
    assert rebel.device_count() == 2 and rebel.npu_is_available(1) and not rebel.npu_is_available(2)
    assert rebel.get_npu_name(1) == "RBLN-CA25" and rebel.get_npu_name(2) is None
    assert {"num_devices", "dtype"} <= set(inspect.signature(rebel.compile).parameters)
    monkeypatch.setenv("REBEL_STANDIN_NPU", "")  # a build host
    assert rebel.device_count() == 0 and rebel.get_npu_name(0) is None


@pytest.mark.parametrize(
    ("name", "cls", "kind", "buckets"),
    [
        ("bert-cls", "RBLNBertModel", "base", [64, 128]),
        ("xlm-roberta-mean", "RBLNXLMRobertaModel", "base", 64),
        ("xlm-roberta-cross-encoder", "RBLNXLMRobertaForSequenceClassification", "seq-cls", 64),
    ],
)
def test_optimum_rbln_encoders_export_save_load_and_equal_transformers(
    name, cls, kind, buckets, standin_rebel, tiny_models, tmp_path
):
    import optimum.rbln
    from rebel import aot, rules

    path = tiny_models[name]
    first = len(standin_rebel.COMPILED)
    with rules.rules_for("sdk"):
        exported = getattr(optimum.rbln, cls).from_pretrained(
            str(path), export=True, rbln_max_seq_len=buckets, rbln_batch_size=2
        )
    graphs = standin_rebel.COMPILED[first:]
    lengths = buckets if isinstance(buckets, list) else [buckets]
    assert [g.input_shapes[0] for g in graphs] == [(2, n) for n in lengths], "one graph per max_seq_len bucket"
    assert all(set(g.input_dtypes) == {"torch.int64"} and "num_devices" in g.options for g in graphs), "probed name"
    exported.save_pretrained(tmp_path / "compiled")
    compiled, loaded = len(standin_rebel.COMPILED), len(aot.LOADED)
    model = getattr(optimum.rbln, cls).from_pretrained(str(tmp_path / "compiled"), export=False)
    assert len(standin_rebel.COMPILED) == compiled and len(aot.LOADED) == loaded + 1, "loaded, not compiled"

    tokenizer, expected_model = reference._load(kind, str(path))
    for length in lengths:
        # With several buckets optimum pads each input to the smallest that holds it; with one, inputs are its size.
        size = length - 10 if len(lengths) > 1 else length
        enc = tokenizer(TEXTS[:2], padding="max_length", max_length=size, return_tensors="pt")
        got = model(**enc)[0]
        with torch.no_grad():
            expected = expected_model(**enc)[0]
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_vllm_rbln_embeds_and_scores_with_a_bert_bi_encoder(tiny_models):
    path = tiny_models["bert-cls"]
    answer = run(path, [{"embed": TEXTS}, {"score": [QUERY, DOCUMENTS]}], max_model_len=128)
    embedded, scored = answer["ops"]
    expected = reference.embed(str(path), TEXTS, pooling="CLS", max_length=128)
    np.testing.assert_allclose(np.array(embedded["result"]), expected, rtol=0, atol=1e-3)
    query, docs = (reference.embed(str(path), t, pooling="CLS", max_length=128) for t in ([QUERY], DOCUMENTS))
    np.testing.assert_allclose(scored["result"], _cosines(np.repeat(query, len(docs), 0), docs), rtol=0, atol=1e-3)
    assert embedded["steps"] == len(TEXTS), "vllm-rbln 0.12 runs one request per step"
    assert [g["input_dtypes"] for g in answer["graphs"]] == [["torch.int64"] * 3], "input_ids, mask, token types"


def test_vllm_rbln_scores_with_an_xlm_roberta_cross_encoder(tiny_models):
    path = tiny_models["xlm-roberta-cross-encoder"]
    answer = run(path, [{"score": [QUERY, DOCUMENTS]}], max_model_len=128)
    expected = reference.cross_encoder_scores(str(path), QUERY, DOCUMENTS, max_length=128)
    np.testing.assert_allclose(answer["ops"][0]["result"], expected, rtol=0, atol=1e-3)
    assert [g["input_names"] for g in answer["graphs"]] == [["input_ids", "attention_mask"]]
