"""Linear methods on Ascend: unquantized, W8A8 int8 (dynamic per-token activations) and
weight-only int8.

* ``None`` (unquantized): ``torch.nn.functional.linear`` (aclnnMatmul through torch_npu).
* ``w8a8_int8``: the checkpoint's fp16/bf16 weight is quantized when it loads, per output channel,
  symmetric int8 (scale = max|w| / 127), stored [N, K] and handed to the kernel as its [K, N]
  transpose; per call ``npu_dynamic_quant`` quantizes the activations per token and
  ``npu_quant_matmul`` multiplies int8 x int8 and dequantizes with both scales (the kernels of
  modelslim's W8A8_DYNAMIC scheme).
* ``torchao:int8wo`` (``--torchao-config int8wo``): the same int8 weight, activations unquantized,
  ``npu_weight_quant_batchmatmul`` dequantizes in the kernel.

Modelslim checkpoints themselves (int8 tensors with ``weight_scale`` / ``input_scale`` /
``deq_scale`` per layer) are not loaded: infer's loader reads fp16/bf16/fp32 checkpoints.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_npu
from infer.core.ops.linear import LinearMethod
from torch import nn


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (int8 [N, K], float32 scale [N]) with w ~= q * scale[:, None]."""
    scale = w.float().abs().amax(dim=1).clamp_min(1e-8) / 127.0
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class AscendDenseLinear(LinearMethod):
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias)


class _Int8Weight(LinearMethod):
    """Shared load step: the float weight becomes ``qweight`` int8 [N, K] + ``w_scale`` [N]."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_per_channel(layer.weight.data)
        layer.qweight = nn.Parameter(q, requires_grad=False)
        layer.w_scale = nn.Parameter(scale, requires_grad=False)
        layer.weight = None  # the float copy is not kept


class W8A8DynamicLinear(_Int8Weight):
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq, x_scale = torch_npu.npu_dynamic_quant(x2)  # int8 [M, K], float32 [M]
        out = torch_npu.npu_quant_matmul(xq, layer.qweight.t(), layer.w_scale,
                                         pertoken_scale=x_scale, bias=layer.bias,
                                         output_dtype=x.dtype)
        return out.view(*shape[:-1], out.shape[-1])


class Int8WeightOnlyLinear(_Int8Weight):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        super().process_weights_after_loading(layer)
        layer.w_scale.data = layer.w_scale.data.to(self.config.dtype)  # the kernel wants x's dtype

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch_npu.npu_weight_quant_batchmatmul(x.reshape(-1, shape[-1]), layer.qweight.t(),
                                                     layer.w_scale, bias=layer.bias)
        return out.view(*shape[:-1], out.shape[-1])
