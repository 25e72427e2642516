"""Fused per-layer ops on torch_npu (registered through ``register_layer_ops``); each returns
None for inputs its kernel does not take, and the core's reference runs instead."""

from __future__ import annotations

import torch
import torch_npu


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``npu_rms_norm`` (y, rstd), or with a residual ``npu_add_rms_norm`` (y, rstd, x + residual)."""
    if residual is None:
        y, _rstd = torch_npu.npu_rms_norm(x, weight, eps)
        return y, None
    y, _rstd, summed = torch_npu.npu_add_rms_norm(x, residual, weight, eps)
    return y, summed


def _table(cos_sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The rotary table in the activation dtype (the kernel's), converted once and kept on the
    table tensor itself (so it lives exactly as long as the table)."""
    by_dtype = cos_sin.__dict__.setdefault("_ascend_by_dtype", {})
    if dtype not in by_dtype:
        by_dtype[dtype] = cos_sin.to(dtype).contiguous()
    return by_dtype[dtype]


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
           rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``_npu_rotary_embedding`` (neox style: rotate halves) in place on [T, N*D] copies of q and k;
    None for partial rotary (rotary_dim < head dim), which the reference handles."""
    t, h, d = q.shape
    if rotary_dim != d or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    q2 = q.contiguous().view(t, h * d)
    k2 = k.contiguous().view(t, -1)
    torch_npu._npu_rotary_embedding(positions, q2, k2, d, _table(cos_sin, q.dtype), True)
    return q2.view(t, h, d), k2.view(t, -1, d)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``npu_swiglu``: silu(first half) * second half."""
    return torch_npu.npu_swiglu(x, dim=-1)
