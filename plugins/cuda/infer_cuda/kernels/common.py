"""Shared launch-time choices and buffers for the Triton kernels."""

from __future__ import annotations

import os

import torch

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown buffers: CUDA graphs captured with them still read them


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed int32 arrival counters for kernels whose programs hand off through
    them in one launch (the split-K GEMV, the fused decode merge): the program that arrives last
    does the follow-up work and sets its counter back to 0, so every launch leaves them all at 0.
    One buffer per device serves every such kernel, since launches on a stream run one after
    another. It grows to a power of two (at least 4096); an outgrown buffer is kept alive."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED.append(buf)
        size = max(4096, 1 << max(0, n - 1).bit_length())
        buf = _COUNTERS[device] = torch.zeros(size, dtype=torch.int32, device=device)
    return buf


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1, CI)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_upcast(dtype: torch.dtype) -> bool:
    """Whether kernels must feed tl.dot float32 operands.

    Triton's CPU interpreter computes bf16/fp16 tl.dot wrongly (numpy has no bf16), so under the
    interpreter half-precision operands are upcast first; compiled kernels use them as they are."""
    return interpreting() and dtype != torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    """float32 dots in full IEEE precision (tf32 would break fp32 parity with the reference)."""
    return "ieee" if dtype == torch.float32 or dot_upcast(dtype) else "tf32"
