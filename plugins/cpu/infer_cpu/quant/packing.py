"""Repacking of weights into the layouts torch's CPU weight-only matmuls take.

int4 (``_weight_int4pack_mm_for_cpu``): codes q in 0..15, one (scale s, zero z) pair per output
row and group of ``group`` input columns; the kernel computes with w = (q - 8) * s + z (checked
against a dense matmul in the tests). GGUF blocks map onto that exactly:

    Q4_0: w = d * (q - 8)    ->  s = d, z = 0
    Q4_1: w = d * q + m      ->  s = d, z = m + 8 * d

int8 (``_weight_int8pack_mm``): codes int8 [N, K] and one scale per output row, w = q * s.
GGUF Q8_0 has one scale per 32 weights, so it is requantized per row (tested for accuracy).

GGUF block layouts (32 weights along a row): Q8_0 d f16 | 32 x int8; Q4_0 d f16 | 16 bytes;
Q4_1 d f16 | m f16 | 16 bytes; byte j holds weight j (low nibble) and weight j + 16 (high).
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import torch

Q = gguf.GGMLQuantizationType
GROUP = 32  # GGUF block size and our int4 group size
INT4_TYPES = frozenset({Q.Q4_0, Q.Q4_1})
INT8_TYPES = frozenset({Q.Q8_0})


@dataclass
class Int4Codes:
    """Unpacked int4 weights: q [N, K] int32 in 0..15; scale, zero [N, K/group] float32."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] with the kernel's convention w = (q - 8) * s + z."""
        g = self.q.shape[1] // self.scale.shape[1]
        s = self.scale.repeat_interleave(g, dim=1)
        z = self.zero.repeat_interleave(g, dim=1)
        return (self.q.float() - 8) * s + z


def _blocks(raw: torch.Tensor, qtype: Q, rows: int) -> torch.Tensor:
    """raw uint8 [rows, bytes_per_row] -> [rows, nblocks, block_bytes]."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    return raw.contiguous().view(torch.uint8).reshape(rows, -1, block_bytes)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float32 read as little-endian float16."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] code bytes -> [..., 32] codes 0..15: byte j holds weight j (low nibble) and
    weight j + 16 (high nibble)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def gguf_int4_codes(raw: torch.Tensor, qtype: Q, rows: int) -> Int4Codes:
    """Q4_0 / Q4_1 raw blocks of a [rows, K] weight -> codes, scales and zeros (exact)."""
    if qtype not in INT4_TYPES:
        raise ValueError(f"not a 4-bit GGUF block type: {qtype!r}")
    blocks = _blocks(raw, qtype, rows)  # [N, nb, bytes]
    d = _f16(blocks[..., 0:2])  # [N, nb]
    qs = blocks[..., 2:] if qtype == Q.Q4_0 else blocks[..., 4:]  # [N, nb, 16]
    q = _nibbles(qs).to(torch.int32)  # [N, nb, 32]
    if qtype == Q.Q4_0:
        zero = torch.zeros_like(d)
    else:
        zero = _f16(blocks[..., 2:4]) + 8 * d
    return Int4Codes(q=q.reshape(rows, -1), scale=d, zero=zero)


def gguf_q8_0_values(raw: torch.Tensor, rows: int) -> torch.Tensor:
    """Q8_0 raw blocks of a [rows, K] weight -> float32 [rows, K] (exact dequantisation)."""
    blocks = _blocks(raw, Q.Q8_0, rows)
    d = _f16(blocks[..., 0:2])  # [N, nb]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()  # [N, nb, 32]
    return (q * d.unsqueeze(-1)).reshape(rows, -1)


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> Int4Codes:
    """Dense [N, K] -> asymmetric int4 with one (scale, zero) per row and group (min/max)."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-10)
    q = ((wg - lo.unsqueeze(-1)) / scale.unsqueeze(-1)).round().clamp(0, 15).to(torch.int32)
    return Int4Codes(q=q.reshape(n, k), scale=scale, zero=lo + 8 * scale)


def quantize_int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense [N, K] -> (int8 [N, K], float32 scale [N]), symmetric per output row."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-10)
    q = (w / scale.unsqueeze(1)).round().clamp(-127, 127).to(torch.int8)
    return q, scale


@dataclass
class PackedInt4:
    """What ``_weight_int4pack_mm_for_cpu`` takes: packed codes and [K/group, N, 2] scale/zero."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor
    group: int
    out_features: int


def pack_int4(codes: Int4Codes, dtype: torch.dtype = torch.bfloat16) -> PackedInt4:
    n, k = codes.q.shape
    group = k // codes.scale.shape[1]
    if group * codes.scale.shape[1] != k or group not in (32, 64, 128, 256):
        raise ValueError(f"int4 packing needs groups of 32/64/128/256 columns, got K={k} with "
                         f"{codes.scale.shape[1]} groups")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.q.contiguous(), 1)
    sz = torch.stack([codes.scale.t(), codes.zero.t()], dim=-1).to(dtype).contiguous()
    return PackedInt4(packed=packed, scales_zeros=sz, group=group, out_features=n)


def int4_matmul(x: torch.Tensor, w: PackedInt4) -> torch.Tensor:
    """x [M, K] (any float dtype) -> [M, N] in x.dtype."""
    xa = x.to(w.scales_zeros.dtype)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(xa, w.packed, w.group, w.scales_zeros)
    return y if y.dtype == x.dtype else y.to(x.dtype)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> [M, N] in x.dtype; ``scale`` [N] must already be in the compute dtype."""
    xa = x.to(scale.dtype)
    y = torch.ops.aten._weight_int8pack_mm(xa, q, scale)
    return y if y.dtype == x.dtype else y.to(x.dtype)


KIND_I8 = 0x100  # QWeight.kind flag: the native GEMM runs int8 activations (the C file's KIND_I8)
KIND_I16 = 0x200  # ... int16 activations (the C file's KIND_I16)
ACTIVATION_FLAGS = {"float32": 0, "int8": KIND_I8, "int16": KIND_I16}  # precision -> kind flag


@dataclass
class QWeight:
    """What the native kernels (``infer_cpu.kernels``) take: GGUF blocks of 32 weights, ``blocks``
    uint8 [N, K/32 * block bytes]. kind 4 = Q4_1 blocks (w = d * q + m, q in 0..15), kind 8 =
    Q8_0 blocks (w = d * q, q int8); d and m float16. ``kind | KIND_I8`` / ``kind | KIND_I16``:
    the same blocks, and the GEMM quantizes the activations to int8 / int16 codes per row and
    32-block (``with_activations``); no flag: float32 activations."""

    kind: int
    blocks: torch.Tensor
    out_features: int
    in_features: int
    # the blocks packed once into the integer-activation GEMM's register-tile layout
    # (``kernels.with_tiles``), read instead of repacking them on every call; None: not packed
    tiles: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K], exactly as gguf dequantises the blocks."""
        n = self.out_features
        if self.block_kind == 8:
            return gguf_q8_0_values(self.blocks, n)
        b = _blocks(self.blocks, Q.Q4_1, n)
        d, m = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]  # [N, nb, 1]
        return (_nibbles(b[..., 4:]).float() * d + m).reshape(n, self.in_features)

    @property
    def block_kind(self) -> int:
        """4 (Q4_1 blocks) or 8 (Q8_0 blocks), without the activation flag."""
        return self.kind & ~(KIND_I8 | KIND_I16)

    @property
    def activations(self) -> str:
        """The activation precision of the GEMM: "float32", "int8" or "int16"."""
        flag = self.kind & (KIND_I8 | KIND_I16)
        return next(name for name, f in ACTIVATION_FLAGS.items() if f == flag)

    @property
    def int8_activations(self) -> bool:
        return self.activations == "int8"

    def with_activations(self, precision: str) -> QWeight:
        """The same blocks (shared, not copied), multiplied with ``precision`` activations
        ("float32", "int8" or "int16")."""
        if precision not in ACTIVATION_FLAGS:
            raise ValueError(f"activation precision {precision!r}: expected one of "
                             f"{', '.join(ACTIVATION_FLAGS)}")
        return QWeight(self.block_kind | ACTIVATION_FLAGS[precision], self.blocks,
                       self.out_features, self.in_features)

    def with_int8_activations(self) -> QWeight:
        return self.with_activations("int8")


def gguf_qweight(raw: torch.Tensor, qtype: Q, rows: int) -> QWeight:
    """Q4_0 / Q4_1 / Q8_0 raw blocks of a [rows, K] weight -> the native kernels' layout: Q4_1 and
    Q8_0 blocks as they are in the file; Q4_0 rewritten as Q4_1 blocks with m = -8 d (exact:
    scaling a float16 by 8 only changes its exponent)."""
    blocks = _blocks(raw, qtype, rows)  # [N, nb, bytes]
    nb = blocks.shape[1]
    if qtype in (Q.Q8_0, Q.Q4_1):  # read in place
        return QWeight(8 if qtype == Q.Q8_0 else 4, blocks.contiguous().reshape(rows, -1), rows,
                       nb * GROUP)
    if qtype != Q.Q4_0:
        raise ValueError(f"no native kernel for GGUF block type {qtype!r}")
    d = blocks[..., 0:2].contiguous().view(torch.float16)  # [N, nb, 1]
    m = (d.float() * -8).to(torch.float16).view(torch.uint8)
    out = torch.cat([blocks[..., 0:2], m, blocks[..., 2:]], dim=-1)  # [N, nb, 20]
    return QWeight(4, out.contiguous().reshape(rows, -1), rows, nb * GROUP)


def quantize_q8_blocks(w: torch.Tensor) -> QWeight:
    """Dense [N, K] -> Q8_0 blocks (float16 scale amax / 127 per 32 weights, int8 codes)."""
    n, k = w.shape
    wg = w.float().reshape(n, k // GROUP, GROUP)
    d = (wg.abs().amax(-1, keepdim=True) / 127).to(torch.float16)  # [N, nb, 1]
    inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = (wg * inv).round().clamp(-127, 127).to(torch.int8)
    blocks = torch.cat([d.view(torch.uint8), q.view(torch.uint8)], dim=-1)  # [N, nb, 34]
    return QWeight(8, blocks.contiguous().reshape(n, -1), n, k)
