"""Shared launch-time choices for the Triton kernels."""

from __future__ import annotations

import os

import torch


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
