"""``--quantization fp8``: per-output-channel fp8 (e4m3) weights, per-token dynamic activation
scales, one ``torch._scaled_mm`` per forward (sm89+).

Weights load in the activation dtype, then ``process_weights_after_loading`` quantizes them:
    w_scale[o] = max_i |W[o, i]| / 448,  Wq = round_fp8(W / w_scale)     Wq [out, in] fp8
Per forward: x_scale[m] = max_i |x[m, i]| / 448, xq = round_fp8(x / x_scale), and
    y = (xq @ Wq^T) * x_scale[m] * w_scale[o]  (+ bias)
Calls of 1-8 rows (decode) may instead take the Triton GEMV of ``kernels/gemv.py`` with the fp8
weight and its scales and x as it is (no activation quantization, so also more exact), for the
weight shapes where it was timed faster than the path above and agrees with the exact product
(``INFER_CUDA_GEMV`` as for bf16). At M = 1 the quantize + ``_scaled_mm`` path reached only 0.53 of
the fp8 bandwidth bound on an H100 (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch
from infer.core.ops.linear import LinearConfig, LinearMethod
from torch import nn

from infer_cuda.kernels import gemv as gemv_kernel
from infer_cuda.ops.linear_dense import SMALL_M_DTYPES, prewarm_small_m, small_m_rows

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
        prewarm_small_m(q.shape[0], q.shape[1], self.config.dtype, q.device, fp8_dtype=FP8,
                        fp8_baseline=scaled_mm_baseline)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])  # [M, in]
        if small_m_rows(x2) and x2.dtype in SMALL_M_DTYPES:
            if torch.compiler.is_compiling():
                y = torch.ops.infer_cuda.gemv_fp8(x2, layer.weight, layer.weight_scale, layer.bias)
            else:
                y = small_m_fp8_linear(x2, layer.weight, layer.weight_scale, layer.bias)
        else:
            y = scaled_mm_linear(x2, layer.weight, layer.weight_scale, layer.bias)
        return y.view(*lead, -1)


def scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, in] -> [M, out]: per-token fp8 activations, one ``torch._scaled_mm``."""
    xq, x_scale = quantize_rows(x)  # [M, in], [M, 1]
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale, out_dtype=x.dtype)
    return y if bias is None else y + bias


def scaled_mm_baseline(x: torch.Tensor, weight: torch.Tensor,
                       weight_scale: torch.Tensor) -> torch.Tensor:
    """The path the GEMV is timed against: ``scaled_mm_linear`` with a [N] or [1, N] scale."""
    return scaled_mm_linear(x, weight, weight_scale.view(1, -1), None)


def small_m_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """x [M <= 8, in] -> [M, out] by whichever of the two paths ``pick`` chose for the shape."""
    choice = gemv_kernel.pick(x.shape[0], weight.shape[0], x.shape[1], x.dtype, x.device,
                              weight, weight_scale, baseline=scaled_mm_baseline)
    if choice == "cublas":
        return scaled_mm_linear(x, weight, weight_scale, bias)
    return gemv_kernel.gemv(x, weight, bias, choice, weight_scale)


@torch.library.custom_op("infer_cuda::gemv_fp8", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias) -> Tensor")
def gemv_fp8_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    return small_m_fp8_linear(x, weight, weight_scale, bias)


@gemv_fp8_op.register_fake
def _gemv_fp8_fake(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])
