"""``--quantization fp8``: per-output-channel fp8 (e4m3) weights, per-token dynamic activation
scales, one ``torch._scaled_mm`` per forward (sm89+).

Weights load in the activation dtype, then ``process_weights_after_loading`` quantizes them:
    w_scale[o] = max_i |W[o, i]| / 448,  Wq = round_fp8(W / w_scale)     Wq [out, in] fp8
Per forward: x_scale[m] = max_i |x[m, i]| / 448, xq = round_fp8(x / x_scale), and
    y = (xq @ Wq^T) * x_scale[m] * w_scale[o]  (+ bias)
"""

from __future__ import annotations

import torch
from infer.core.ops.linear import LinearConfig, LinearMethod
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], float32 scale [M, 1]) with x ~= q * scale."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


class Fp8LinearMethod(LinearMethod):
    def __init__(self, config: LinearConfig) -> None:
        super().__init__(config)
        if config.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"--quantization fp8 needs --dtype bfloat16 or float16, not {config.dtype}")

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       bias: bool) -> None:
        if in_features % 16 or out_features % 16:
            raise ValueError(f"--quantization fp8: layer shape {out_features}x{in_features} is not a "
                             "multiple of 16, which the fp8 GEMM needs")
        super().create_weights(layer, in_features, out_features, bias)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_rows(layer.weight.data)  # [out, in], [out, 1]
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = scale.view(1, -1).contiguous()  # [1, out]

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        lead = x.shape[:-1]
        xq, x_scale = quantize_rows(x.reshape(-1, x.shape[-1]))  # [M, in], [M, 1]
        y = torch._scaled_mm(xq, layer.weight.t(), scale_a=x_scale, scale_b=layer.weight_scale,
                             out_dtype=x.dtype)
        if layer.bias is not None:
            y = y + layer.bias
        return y.view(*lead, -1)
