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


@recorded()
def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *,
                     offset: torch.Tensor | None = None, pertoken_scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, output_dtype: torch.dtype | None = None
                     ) -> torch.Tensor:
    """int8 x int8 matmul with dequantisation: x1 int8 [M, K], x2 int8 [K, N] (any strides, a
    transposed [N, K] weight is the usual x2), scale [N] or [1] (float32/bfloat16) per output
    channel, pertoken_scale float32 [M]; int32 bias is added to the int32 accumulator, a float
    bias after dequantisation. out = (x1 @ x2 (+ int32 bias)) * scale * pertoken_scale (+ bias).
    Document: hiascend.com "torch_npu.npu_quant_matmul" (op-plugin
    docs/context/torch_npu-npu_quant_matmul.md)."""
    dtype_in("x1", x1, (torch.int8,))
    dtype_in("x2", x2, (torch.int8,))
    dtype_in("scale", scale, (torch.float32, torch.bfloat16))
    need(x1.dim() == 2 and x2.dim() == 2 and x1.shape[1] == x2.shape[0],
         f"x1 [M, K] and x2 [K, N] expected, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    n = x2.shape[1]
    need(scale.shape in ((n,), (1,)), f"scale must be [N]={n} or [1], got {tuple(scale.shape)}")
    if offset is not None:
        raise NotImplementedError("offset is not emulated")
    if output_dtype not in HALF:
        raise NotImplementedError("emulation covers float16/bfloat16 outputs")
    acc = x1.long() @ x2.long()  # exact int accumulation
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.long()
    out = acc.double() * scale.double()
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
    if antiquant_offset is not None:
        w = w + antiquant_offset.float().reshape(-1)
    w = w * antiquant_scale.float().reshape(-1)
    out = x.float() @ w
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
