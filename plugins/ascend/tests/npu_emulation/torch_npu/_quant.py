"""Emulated int8 quantization and quantized matmuls of torch_npu."""

from __future__ import annotations

import torch

from ._check import dtype_in, need
from ._graph import recorded

HALF = (torch.float16, torch.bfloat16)


@recorded()
def npu_dynamic_quant(x: torch.Tensor, smooth_scales: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8: scale = max|x| over the last dim / 127 (float32, shape x.shape[:-1]),
    y = round(x / scale) as int8. Document: hiascend.com "torch_npu.npu_dynamic_quant"
    (op-plugin docs/context/torch_npu-npu_dynamic_quant.md)."""
    dtype_in("x", x, HALF)
    if smooth_scales is not None:
        raise NotImplementedError("smooth_scales is not emulated")
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / 127.0
    y = torch.round(xf / scale.clamp_min(1e-12)[..., None]).clamp(-128, 127).to(torch.int8)
    return y, scale


def _int64_scale_to_float(scale: torch.Tensor) -> torch.Tensor:
    """The int64 scale ``npu_trans_quant_param`` makes: the float32 scale's bits in the low 32
    bits (what modelslim writes as ``deq_scale`` for float16 models). Offsets packed into the
    high bits are not emulated."""
    need(bool((scale >> 32).eq(0).all()), "int64 scale with high bits set (a packed offset) "
         "is not emulated")
    return (scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


@recorded()
def npu_trans_quant_param(scale: torch.Tensor, offset: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """float32 scale [t] or [1, n] -> the int64 form ``npu_quant_matmul`` takes for float16/int8
    outputs without a per-token scale. Document: hiascend.com "torch_npu.npu_trans_quant_param"
    (Ascend Extension for PyTorch API reference). The document does not give the bit layout;
    the emulation stores the float32 bits in the low 32 bits, the layout vllm-ascend's
    ``scale_from_float_to_int64`` writes for modelslim's int64 ``deq_scale`` (only an NPU run
    proves it)."""
    dtype_in("scale", scale, (torch.float32,))
    need(scale.dim() == 1 or (scale.dim() == 2 and scale.shape[0] == 1),
         "scale must be [t] or [1, n]")
    if offset is not None:
        raise NotImplementedError("offset is not emulated")
    return scale.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


@recorded()
def npu_quantize(input: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                 dtype: torch.dtype, axis: int = 1, div_mode: bool = True) -> torch.Tensor:
    """Static quantization: div_mode False: y = input * scales + zero_points, div_mode True:
    y = input / scales + zero_points, rounded to nearest (ties to even) and saturated to int8.
    Document: hiascend.com "torch_npu.npu_quantize" (Ascend Extension for PyTorch API reference,
    torch_npu-npu_quantize.md). Emulated: div_mode False with dtype torch.qint8 (int8 output);
    scales 1-D of size 1 or input.shape[axis] on the last axis, in input's dtype (float16 /
    bfloat16 / float32); zero_points None or scales' shape and dtype."""
    A = (torch.float16, torch.bfloat16, torch.float32)  # noqa: N806
    dtype_in("input", input, A)
    if div_mode or dtype != torch.qint8:
        raise NotImplementedError("emulation covers div_mode=False with dtype torch.qint8")
    need(axis in (-1, input.dim() - 1), "emulation covers the last axis (axis -1)")
    need(scales.dtype == input.dtype, "scales must have input's dtype when div_mode is False")
    need(scales.dim() == 1 and scales.shape[0] in (1, input.shape[-1]),
         f"scales must be [1] or [{input.shape[-1]}], got {tuple(scales.shape)}")
    y = input.float() * scales.float()
    if zero_points is not None:
        need(zero_points.shape == scales.shape and zero_points.dtype == scales.dtype,
             "zero_points must have scales' shape and dtype")
        y = y + zero_points.float()
    return torch.round(y).clamp(-128, 127).to(torch.int8)


@recorded()
def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *,
                     offset: torch.Tensor | None = None, pertoken_scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, output_dtype: torch.dtype | None = None
                     ) -> torch.Tensor:
    """int8 x int8 matmul with dequantisation: x1 int8 [M, K], x2 int8 [K, N] (any strides, a
    transposed [N, K] weight is the usual x2), scale [N] or [1] per output channel,
    pertoken_scale float32 [M]; int32 bias is added to the int32 accumulator, a float bias after
    dequantisation. out = (x1 @ x2 (+ int32 bias)) * scale * pertoken_scale (+ bias).
    Document: hiascend.com "torch_npu.npu_quant_matmul" (op-plugin
    docs/context/torch_npu-npu_quant_matmul.md), whose table of dtype combinations is enforced:
    float16 output without pertoken_scale takes the int64 scale of npu_trans_quant_param and an
    int32 bias; float16 output with pertoken_scale a float32 scale; bfloat16 output a float32 or
    bfloat16 scale."""
    dtype_in("x1", x1, (torch.int8,))
    dtype_in("x2", x2, (torch.int8,))
    dtype_in("scale", scale, (torch.float32, torch.bfloat16, torch.int64))
    need(x1.dim() == 2 and x2.dim() == 2 and x1.shape[1] == x2.shape[0],
         f"x1 [M, K] and x2 [K, N] expected, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    n = x2.shape[1]
    need(scale.shape in ((n,), (1,)), f"scale must be [N]={n} or [1], got {tuple(scale.shape)}")
    if offset is not None:
        raise NotImplementedError("offset is not emulated")
    if output_dtype not in HALF:
        raise NotImplementedError("emulation covers float16/bfloat16 outputs")
    if output_dtype == torch.float16 and pertoken_scale is None:
        dtype_in("scale (float16 output, no pertoken_scale)", scale, (torch.int64,))
        allowed_bias = (torch.int32,)
    elif output_dtype == torch.float16:
        dtype_in("scale (float16 output)", scale, (torch.float32,))
        allowed_bias = (torch.int32, torch.float16, torch.float32)
    else:
        dtype_in("scale (bfloat16 output)", scale, (torch.float32, torch.bfloat16))
        allowed_bias = (torch.int32, torch.bfloat16, torch.float32)
    if bias is not None:
        dtype_in("bias", bias, allowed_bias)
        need(bias.shape == (n,), "bias must be [N]")
    acc = x1.long() @ x2.long()  # exact int accumulation
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.long()
    fscale = _int64_scale_to_float(scale) if scale.dtype == torch.int64 else scale
    out = acc.double() * fscale.double()
    if pertoken_scale is not None:
        dtype_in("pertoken_scale", pertoken_scale, (torch.float32,))
        need(pertoken_scale.shape == (x1.shape[0],), "pertoken_scale must be [M]")
        out = out * pertoken_scale.double()[:, None]
    if bias is not None and bias.dtype != torch.int32:
        out = out + bias.double()
    return out.to(output_dtype)


@recorded()
def npu_weight_quant_batchmatmul(x: torch.Tensor, weight: torch.Tensor,
                                 antiquant_scale: torch.Tensor,
                                 antiquant_offset: torch.Tensor | None = None, *,
                                 bias: torch.Tensor | None = None, **unsupported) -> torch.Tensor:
    """Weight-only int8: out = x @ ((weight + antiquant_offset) * antiquant_scale) (+ bias);
    x fp16/bf16 [M, K], weight int8 [K, N], antiquant_scale [N] in x's dtype. Document:
    hiascend.com "torch_npu.npu_weight_quant_batchmatmul" (op-plugin
    docs/context/torch_npu-npu_weight_quant_batchmatmul.md)."""
    if unsupported:
        raise NotImplementedError(f"emulation does not cover {sorted(unsupported)}")
    dtype_in("x", x, HALF)
    dtype_in("weight", weight, (torch.int8,))
    need(x.shape[-1] == weight.shape[0], "x [M, K] and weight [K, N] disagree on K")
    need(antiquant_scale.dtype == x.dtype, "antiquant_scale must have x's dtype")
    need(antiquant_scale.shape in ((weight.shape[1],), (1, weight.shape[1])),
         "antiquant_scale must be [N] (per channel)")
    w = weight.float()
    if antiquant_offset is not None:  # added to the int8 weight (modelslim stores its negation)
        need(antiquant_offset.shape == antiquant_scale.shape
             and antiquant_offset.dtype == antiquant_scale.dtype,
             "antiquant_offset must have antiquant_scale's shape and dtype")
        w = w + antiquant_offset.float().reshape(-1)
    w = w * antiquant_scale.float().reshape(-1)
    out = x.float() @ w
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
