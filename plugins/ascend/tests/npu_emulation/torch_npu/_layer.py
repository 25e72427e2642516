"""Emulated per-layer ops of torch_npu: RMSNorm (with the residual add), rotary, SwiGLU."""

from __future__ import annotations

import torch

from ._check import dtype_in, need
from ._graph import recorded

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1] float32
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


@recorded()
def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2, last dim) + epsilon) * gamma; returns (y in x's dtype, rstd
    float32 [..., 1]). Document: hiascend.com Ascend Extension for PyTorch API reference,
    "torch_npu.npu_rms_norm" (op-plugin docs/context/torch_npu-npu_rms_norm.md)."""
    dtype_in("x", x, FLOATS)
    need(gamma.shape == x.shape[-1:], f"gamma shape {tuple(gamma.shape)} must be [{x.shape[-1]}]")
    return _rms(x, gamma, epsilon)


@recorded()
def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x = x1 + x2 (in the inputs' dtype); returns (rmsnorm(x) * gamma, rstd, x). Document:
    hiascend.com "torch_npu.npu_add_rms_norm" (op-plugin docs/context/torch_npu-npu_add_rms_norm.md):
    outputs y, rstd, x in that order."""
    dtype_in("x1", x1, FLOATS)
    need(x1.shape == x2.shape and x1.dtype == x2.dtype, "x1 and x2 must match in shape and dtype")
    need(gamma.shape == x1.shape[-1:], "gamma must be [last dim]")
    x = x1 + x2
    y, rstd = _rms(x, gamma, epsilon)
    return y, rstd, x


@recorded()
def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Split x in two halves along ``dim`` (a, b) and return silu(a) * b. Document: hiascend.com
    "torch_npu.npu_swiglu" (op-plugin docs/context/torch_npu-npu_swiglu.md)."""
    dtype_in("x", x, FLOATS)
    need(x.shape[dim] % 2 == 0, "the split dim must be even")
    a, b = x.chunk(2, dim=dim)
    return (torch.nn.functional.silu(a.float()) * b.float()).to(x.dtype)


@recorded()
def _npu_rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                          head_size: int, cos_sin_cache: torch.Tensor, is_neox_style: bool) -> None:
    """Rotate query and key in place (vLLM's rotary_embedding contract, which vllm-ascend's
    ``vllm_ascend/ops/rotary_embedding.py`` calls as ``torch_npu._npu_rotary_embedding(positions,
    query, key, head_size, cos_sin_cache, is_neox_style)``): query [T, N*head_size] and key
    [T, KV_N*head_size], 2-D and contiguous; cos_sin_cache [max_position, rot_dim] in the query's
    dtype, first half cos, second half sin; the first rot_dim dims of each head are rotated
    (neox: halves, else interleaved pairs); positions [T] integer."""
    need(query.dim() == 2 and key.dim() == 2, "query/key must be 2-D [T, heads * head_size]")
    need(query.is_contiguous() and key.is_contiguous(), "query/key must be contiguous")
    need(query.shape[1] % head_size == 0 and key.shape[1] % head_size == 0,
         "query/key widths must be multiples of head_size")
    need(cos_sin_cache.dtype == query.dtype, "cos_sin_cache must have the query's dtype")
    need(not positions.is_floating_point() and positions.shape == (query.shape[0],),
         "positions must be integer [T]")
    rot = cos_sin_cache.shape[1]
    need(rot <= head_size and rot % 2 == 0, "rot_dim must be even and <= head_size")
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    for t in (query, key):
        x = t.view(t.shape[0], -1, head_size)
        r = x[..., :rot].float()
        if is_neox_style:
            x1, x2 = r.chunk(2, dim=-1)
        else:
            x1, x2 = r[..., 0::2], r[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        out = torch.cat([o1, o2], -1) if is_neox_style else torch.stack([o1, o2], -1).flatten(-2)
        x[..., :rot] = out.to(t.dtype)
