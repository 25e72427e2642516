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

``w8a8_int8`` on a checkpoint written by msModelSlim (a ``quant_model_description.json`` beside
the weights) loads it as ``--quantization modelslim`` does (``infer_ascend.ops.modelslim``), as
SGLang's w8a8_int8 config does on NPUs; on an fp16/bf16 checkpoint it quantizes at load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_npu
from infer.core.ops.linear import LinearConfig, LinearMethod
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


def dynamic_w8a8(x: torch.Tensor, qweight: torch.Tensor, w_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] float16/bfloat16, qweight int8 [N, K], w_scale float32 [N] (symmetric, per
    output channel): ``npu_dynamic_quant`` per token, then ``npu_quant_matmul`` with both scales."""
    shape = x.shape
    xq, x_scale = torch_npu.npu_dynamic_quant(x.reshape(-1, shape[-1]))  # int8 [M, K], f32 [M]
    out = torch_npu.npu_quant_matmul(xq, qweight.t(), w_scale, pertoken_scale=x_scale,
                                     bias=bias, output_dtype=x.dtype)
    return out.view(*shape[:-1], out.shape[-1])


def weight_only_int8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                     offset: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K], qweight int8 [N, K]; the kernel computes x @ ((w + offset) * scale) with
    scale / offset [N] in x's dtype (``npu_weight_quant_batchmatmul``)."""
    shape = x.shape
    out = torch_npu.npu_weight_quant_batchmatmul(x.reshape(-1, shape[-1]), qweight.t(), scale,
                                                 offset, bias=bias)
    return out.view(*shape[:-1], out.shape[-1])


class W8A8DynamicLinear(_Int8Weight):
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return dynamic_w8a8(x, layer.qweight, layer.w_scale, layer.bias)


class Int8WeightOnlyLinear(_Int8Weight):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        super().process_weights_after_loading(layer)
        layer.w_scale.data = layer.w_scale.data.to(self.config.dtype)  # the kernel wants x's dtype

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return weight_only_int8(x, layer.qweight, layer.w_scale, None, layer.bias)


def w8a8_int8(config: LinearConfig) -> LinearMethod:
    """``--quantization w8a8_int8``: a msModelSlim checkpoint loads per its description (as
    ``modelslim``); an fp16/bf16 checkpoint is quantized at load (W8A8 dynamic)."""
    from infer_ascend.ops.modelslim import ModelslimLinear, find_description

    if find_description(config.checkpoint_dir) is not None:
        return ModelslimLinear(config)
    return W8A8DynamicLinear(config)
