"""Dequantisation of GGUF tensors in torch (Q4_0, Q4_1, Q8_0, F16, BF16, F32); other block types
go through the ``gguf`` package's numpy reference.

Block layouts (32 weights per block, along a row):
    Q8_0: d f16 | 32 x int8              value = d * q
    Q4_0: d f16 | 16 bytes of nibbles     value = d * (q - 8)
    Q4_1: d f16 | m f16 | 16 bytes        value = d * q + m
where byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
QUANTIZED_TYPES = frozenset(t for t in Q if t not in (Q.F32, Q.F16, Q.BF16, Q.F64, Q.I8, Q.I16,
                                                       Q.I32, Q.I64))


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """qs [N, 16] uint8 -> [N, 32] values 0..15 (low nibbles first, then high)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def dequantize(raw: torch.Tensor, qtype: Q, shape: tuple[int, ...]) -> torch.Tensor:
    """raw uint8 [rows, bytes_per_row] (or the typed array for F32/F16) -> float32 ``shape``."""
    if qtype == Q.F32:
        return raw.view(torch.float32).reshape(shape).clone()
    if qtype == Q.F16:
        return raw.view(torch.float16).reshape(shape).float()
    if qtype == Q.BF16:
        return raw.contiguous().view(torch.uint8).view(torch.bfloat16).reshape(shape).float()
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
        block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
        blocks = raw.contiguous().view(torch.uint8).reshape(-1, block_bytes)  # [N, bytes]
        d = blocks[:, :2].contiguous().view(torch.float16).float()  # [N, 1]
        if qtype == Q.Q8_0:
            q = blocks[:, 2:].contiguous().view(torch.int8).float()
            return (d * q).reshape(shape)
        if qtype == Q.Q4_0:
            return (d * (_nibbles(blocks[:, 2:]).float() - 8)).reshape(shape)
        m = blocks[:, 2:4].contiguous().view(torch.float16).float()
        return (d * _nibbles(blocks[:, 4:]).float() + m).reshape(shape)
    out = gguf.quants.dequantize(np.ascontiguousarray(raw.numpy()), qtype)
    return torch.from_numpy(np.ascontiguousarray(out)).reshape(shape)
