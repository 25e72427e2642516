"""The CPU plugin's per-layer ops: the native kernels (``infer_cpu.kernels``) for float32
inputs they fit; ``None`` otherwise, so the layer runs the torch reference."""

from __future__ import annotations

import torch

from infer_cpu import kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    return kernels.rms_norm(x, weight, eps, residual)


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
           rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    return (q, k) if kernels.rope_(positions, q, k, cos_sin, rotary_dim) else None


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    return kernels.silu_mul(x)
