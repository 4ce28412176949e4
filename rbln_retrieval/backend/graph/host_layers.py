"""BERT-family and ModernBERT encoder blocks with their elementwise steps written in place, for host kernels.

Eager PyTorch gives every op a fresh output tensor, and on the host a fresh multi-megabyte activation is paid for
in page faults, about as much again as the op itself. vLLM's stock CPU runner avoids this by compiling the model
with Inductor, which fuses these ops and reuses buffers. The bundled host runs eagerly, so its blocks write GELU
and the residual add into the GEMM output that consumes them, a tensor nothing else reads. The arithmetic is
unchanged, so results are bit-identical.

Only vLLM's own BERT classes (which RoBERTa and XLM-R reuse) and ModernBERT's layer and MLP are rebound, matched by
exact type, so a subclass with a forward of its own keeps it.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from transformers.activations import GELUActivation
from vllm.model_executor.layers.activation import GELU
from vllm.model_executor.models.bert import BertIntermediate, BertOutput, BertSelfOutput
from vllm.model_executor.models.modernbert import ModernBertLayer, ModernBertMLP


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


def write_in_place(model: nn.Module) -> int:
    """Rebinds ``model``'s BERT and ModernBERT blocks to the in-place forwards; returns how many it rebound."""
    rebound = 0
    for module in model.modules():
        if type(module) is BertIntermediate and type(module.intermediate_act_fn) is GELU:
            module.forward = types.MethodType(_intermediate_forward, module)
        elif type(module) in (BertOutput, BertSelfOutput):
            module.forward = types.MethodType(_output_forward, module)
        elif type(module) is ModernBertLayer:
            module.forward = types.MethodType(_modernbert_layer_forward, module)
        elif type(module) is ModernBertMLP and type(module.act) is GELUActivation:
            module.forward = types.MethodType(_modernbert_mlp_forward, module)
        else:
            continue
        rebound += 1
    return rebound
