# ruff: noqa: ANN001, ANN201  (Triton jit helpers: untyped pointers and scalars by convention)
"""The paged K/V tile load shared by the decode and extend attention kernels (Triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(K, V, BlockTables, b, stride_bt, kvh, offs_n, mask_n, offs_d, mask_d,
                 stride_kslot, stride_kh, stride_vslot, stride_vh, k_scale, v_scale, q,
                 PAGE_SIZE: tl.constexpr, KV_SCALED: tl.constexpr, DOT_F32: tl.constexpr):
    """Keys and values [N, D] of sequence ``b``, kv head ``kvh``, at token positions ``offs_n``
    (rows outside ``mask_n`` read as 0), through the sequence's block table. Scaled (fp8) caches
    are dequantised to q's dtype; with DOT_F32 both come back as float32."""
    page = tl.load(BlockTables + b * stride_bt + offs_n // PAGE_SIZE, mask=mask_n, other=0)
    slot = page.to(tl.int64) * PAGE_SIZE + offs_n % PAGE_SIZE  # [N]
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(K + slot[:, None] * stride_kslot + kvh * stride_kh + offs_d[None, :],
                mask=kv_mask, other=0.0)  # [N, D]
    v = tl.load(V + slot[:, None] * stride_vslot + kvh * stride_vh + offs_d[None, :],
                mask=kv_mask, other=0.0)
    if KV_SCALED:
        k = (k.to(tl.float32) * k_scale).to(q.dtype)
        v = (v.to(tl.float32) * v_scale).to(q.dtype)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v
