"""BERT-family and ModernBERT encoder blocks with their elementwise steps written in place, for host kernels.

Eager PyTorch gives every op a fresh output tensor, and on the host a fresh multi-megabyte activation is paid for
in page faults, about as much again as the op itself. vLLM's stock CPU runner avoids this by compiling the model
with Inductor, which fuses these ops and reuses buffers. The bundled host runs eagerly, so its blocks write GELU
and the residual add into the GEMM output that consumes them, a tensor nothing else reads. The arithmetic is
unchanged, so results are bit-identical.

On AMX CPUs in bfloat16 (``fuse_epilogues``) the BERT blocks go further: GELU and the residual add run inside the
GEMM that produces their input, as oneDNN post-ops on the float32 accumulator (what Inductor emits for these
patterns with frozen weights), each weight packed once for oneDNN; the attention's qkv projection runs on oneDNN's
packed GEMM too. On AMX the GEMMs are fast enough that a separate
pass over the activation costs about as much as the GEMM did, and each pass is another wait for every thread. The
fused epilogue rounds to bfloat16 once where the eager one rounds twice (a bf16 ulp at most, per row: a text's
vector still does not depend on its neighbours' values); float32 and the other CPU classes keep the eager blocks.

Only vLLM's own BERT classes (which RoBERTa and XLM-R reuse) and ModernBERT's layer and MLP are rebound, matched by
exact type, so a subclass with a forward of its own keeps it.

May import: torch, transformers' and vLLM's model classes, ``rbln_retrieval.cpu_features``.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from transformers.activations import GELUActivation
from vllm.model_executor.layers.activation import GELU
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.models.bert import BertIntermediate, BertOutput, BertSelfAttention, BertSelfOutput
from vllm.model_executor.models.modernbert import ModernBertLayer, ModernBertMLP

from rbln_retrieval import cpu_features

# The row count oneDNN lays a packed weight out for: a full step of the default budget (other counts run on it too).
PACK_ROWS = 4096


def _intermediate_forward(self: BertIntermediate, hidden_states: torch.Tensor) -> torch.Tensor:
    hidden_states, _ = self.dense(hidden_states)
    return torch.ops.aten.gelu_(hidden_states)


def _output_forward(
    self: BertOutput | BertSelfOutput, hidden_states: torch.Tensor, input_tensor: torch.Tensor
) -> torch.Tensor:
    hidden_states, _ = self.dense(hidden_states)
    hidden_states += input_tensor
    return self.LayerNorm(hidden_states)


def _modernbert_layer_forward(
    self: ModernBertLayer, hidden_states: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    # The residual adds go into the attention and MLP outputs (fresh GEMM results); addition commutes exactly.
    attn_output = self.attn(hidden_states=self.attn_norm(hidden_states), position_ids=position_ids)
    attn_output += hidden_states
    mlp_output = self.mlp(self.mlp_norm(attn_output))
    mlp_output += attn_output
    return mlp_output


def _modernbert_mlp_forward(self: ModernBertMLP, hidden_states: torch.Tensor) -> torch.Tensor:
    input_gate, _ = self.Wi(hidden_states)
    activated, gate = input_gate.chunk(2, dim=-1)
    activated = self.act(activated)  # a fresh contiguous tensor: the gate multiplies into it
    activated *= gate
    return self.Wo(activated)[0]


def _fused_intermediate_forward(self: BertIntermediate, hidden_states: torch.Tensor) -> torch.Tensor:
    # vLLM's GELU is the exact (erf) one, as oneDNN's "none" algorithm.
    weight, bias = self.dense.fused_weight, self.dense.fused_bias
    return torch.ops.mkldnn._linear_pointwise(hidden_states, weight, bias, "gelu", [], "none")


def _fused_output_forward(
    self: BertOutput | BertSelfOutput, hidden_states: torch.Tensor, input_tensor: torch.Tensor
) -> torch.Tensor:
    weight, bias = self.dense.fused_weight, self.dense.fused_bias
    hidden_states = torch.ops.mkldnn._linear_pointwise.binary(hidden_states, input_tensor, weight, bias, "add")
    return self.LayerNorm(hidden_states)


def _packed_attention_forward(self: BertSelfAttention, hidden_states: torch.Tensor) -> torch.Tensor:
    # The qkv projection has no epilogue to fuse, but on AMX oneDNN's packed GEMM does about two thirds of the work
    # of vLLM's choice for a weight this small (SGL's kernel) at a full step's rows, and the same at a query's.
    qkv_proj = self.qkv_proj
    qkv = torch.ops.mkldnn._linear_pointwise(hidden_states, qkv_proj.fused_weight, qkv_proj.fused_bias, "none", [], "")
    q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
    return self.attn(q, k, v)


def fuse_epilogues(dtype: torch.dtype) -> bool:
    """Whether the BERT blocks take oneDNN's fused GEMM epilogues: bfloat16 on AMX CPUs."""
    return dtype == torch.bfloat16 and cpu_features.amx() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _packed(dense: nn.Module) -> bool:
    """Packs ``dense``'s weight (kept by ``vllm_compat.unpacked_weights_kept``) for oneDNN's fused linear; False
    when it is not a plain bfloat16 Linear with its whole weight (quantized, sharded, bias added outside)."""
    weight = getattr(dense, "unpacked_weight", None)
    plain = (
        isinstance(dense, LinearBase)
        and isinstance(dense.quant_method, UnquantizedLinearMethod)
        and not dense.skip_bias_add
        and dense.tp_size == 1
    )
    if not plain or weight is None or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return False
    dense.fused_weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
    # vLLM's packed-GEMM dispatch turns the bias to float32 (exactly: it was bfloat16); oneDNN takes the input's.
    dense.fused_bias = None if dense.bias is None else dense.bias.detach().to(weight.dtype)
    return True


def write_in_place(model: nn.Module, fused: bool = False) -> tuple[int, int]:
    """Rebinds ``model``'s BERT and ModernBERT blocks to the in-place forwards, the BERT blocks to oneDNN's packed
    GEMMs with fused epilogues where ``fused`` (``fuse_epilogues``) and their weights allow; returns how many blocks
    it rebound and how many of those run on oneDNN's packed GEMMs. Releases the unpacked weights the model was
    loaded with (``vllm_compat.unpacked_weights_kept``)."""
    rebound = fast_blocks = 0
    for module in model.modules():
        if type(module) is BertIntermediate and type(module.intermediate_act_fn) is GELU:
            fast = fused and _packed(module.dense)
            module.forward = types.MethodType(_fused_intermediate_forward if fast else _intermediate_forward, module)
        elif type(module) in (BertOutput, BertSelfOutput):
            fast = fused and _packed(module.dense)
            module.forward = types.MethodType(_fused_output_forward if fast else _output_forward, module)
        elif type(module) is BertSelfAttention and fused and _packed(module.qkv_proj):
            fast = True
            module.forward = types.MethodType(_packed_attention_forward, module)
        elif type(module) is ModernBertLayer:
            fast = False
            module.forward = types.MethodType(_modernbert_layer_forward, module)
        elif type(module) is ModernBertMLP and type(module.act) is GELUActivation:
            fast = False
            module.forward = types.MethodType(_modernbert_mlp_forward, module)
        else:
            continue
        rebound += 1
        fast_blocks += fast
    for module in model.modules():
        module.__dict__.pop("unpacked_weight", None)
    return rebound, fast_blocks
