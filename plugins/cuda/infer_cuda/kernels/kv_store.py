# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Write new keys/values into the paged cache (optionally rotating q and k first), Triton.

Token t's k/v [Hkv, D] go to flat slot slot_mapping[t] of [num_slots, Hkv, D]. A negative slot
means "padding row, write nothing": CUDA-graph padding rows use it so they never touch a page that
a real sequence owns. An fp8 cache stores value / scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infer.core.ops.attention import RotaryArgs


@triton.jit
def _store_kv_kernel(
    K, V, KCache, VCache, SlotMapping, inv_k_scale, inv_v_scale,
    stride_kt, stride_vt, stride_kcs, stride_vcs,
    ROW: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr, QMAX: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(SlotMapping + t).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW  # one row is Hkv * D contiguous elements
        k = tl.load(K + t * stride_kt + offs, mask=mask)
        v = tl.load(V + t * stride_vt + offs, mask=mask)
        if SCALED:
            k = tl.minimum(tl.maximum(k.to(tl.float32) * inv_k_scale, -QMAX), QMAX)  # saturate
            v = tl.minimum(tl.maximum(v.to(tl.float32) * inv_v_scale, -QMAX), QMAX)
        tl.store(KCache + slot * stride_kcs + offs, k.to(KCache.dtype.element_ty), mask=mask)
        tl.store(VCache + slot * stride_vcs + offs, v.to(VCache.dtype.element_ty), mask=mask)


def _qmax(dtype: torch.dtype) -> float:
    """Largest finite value of the cache dtype (fp8 stores saturate to it)."""
    return float(torch.finfo(dtype).max)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v [T, Hkv, D] (each token's row contiguous); caches [P, page, Hkv, D]; slots [T]."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    row = k.shape[1] * k.shape[2]
    if k.stride(2) != 1 or k.stride(1) != k.shape[2]:
        k = k.contiguous()
    if v.stride(2) != 1 or v.stride(1) != v.shape[2]:
        v = v.contiguous()
    kc = k_cache.view(-1, row)
    vc = v_cache.view(-1, row)
    _store_kv_kernel[(num_tokens,)](
        k, v, kc, vc, slot_mapping, 1.0 / k_scale, 1.0 / v_scale,
        k.stride(0), v.stride(0), kc.stride(0), vc.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row), SCALED=k_cache.dtype != k.dtype,
        QMAX=_qmax(k_cache.dtype),
        num_warps=4,
    )


@triton.jit
def _rotate_tile(X, row_ptr, stride_h, offs_h, mask_h, offs_d, cos, sin, partner, sign,
                 HEAD_DIM: tl.constexpr, ROT: tl.constexpr):
    """One token's heads [BH, BD] rotate-half over the first ROT dims, float32 (dims past ROT
    pass through: cos 1, sin 0 there)."""
    mask = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
    base = X + row_ptr + offs_h[:, None] * stride_h
    x = tl.load(base + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    return x * cos[None, :] + sign[None, :] * xp * sin[None, :], mask


@triton.jit
def _rope_store_kernel(
    Q, K, V, QOut, KCache, VCache, SlotMapping, Positions, CosSin, inv_k_scale, inv_v_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_kcs, stride_kch, stride_vcs, stride_vch, stride_cs,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HKV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROT: tl.constexpr,
    SCALED: tl.constexpr, QMAX: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(Positions + t).to(tl.int64)
    half: tl.constexpr = ROT // 2
    offs_d = tl.arange(0, BLOCK_D)
    in_rot = offs_d < ROT
    first = offs_d < half
    # rotate-half pairs dim d with d + R/2 (first half, sign -) or d - R/2 (second half, sign +)
    partner = tl.where(in_rot, tl.where(first, offs_d + half, offs_d - half), offs_d)
    sign = tl.where(first, -1.0, 1.0)
    freq = tl.where(first, offs_d, offs_d - half)
    cos = tl.load(CosSin + pos * stride_cs + freq, mask=in_rot, other=1.0)
    sin = tl.load(CosSin + pos * stride_cs + half + freq, mask=in_rot, other=0.0)

    offs_h = tl.arange(0, BLOCK_H)
    q, mask_q = _rotate_tile(Q, t * stride_qt, stride_qh, offs_h, offs_h < NUM_HEADS, offs_d,
                             cos, sin, partner, sign, HEAD_DIM, ROT)
    tl.store(QOut + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
             q.to(QOut.dtype.element_ty), mask=mask_q)

    slot = tl.load(SlotMapping + t).to(tl.int64)
    if slot >= 0:  # negative: a padding row, write nothing
        offs_hk = tl.arange(0, BLOCK_HKV)
        mask_hk = offs_hk < NUM_KV_HEADS
        k, mask_kv = _rotate_tile(K, t * stride_kt, stride_kh, offs_hk, mask_hk, offs_d,
                                  cos, sin, partner, sign, HEAD_DIM, ROT)
        v = tl.load(V + t * stride_vt + offs_hk[:, None] * stride_vh + offs_d[None, :],
                    mask=mask_kv, other=0.0)
        if SCALED:
            k = tl.minimum(tl.maximum(k * inv_k_scale, -QMAX), QMAX)  # saturate
            v = tl.minimum(tl.maximum(v.to(tl.float32) * inv_v_scale, -QMAX), QMAX)
        tl.store(KCache + slot * stride_kcs + offs_hk[:, None] * stride_kch + offs_d[None, :],
                 k.to(KCache.dtype.element_ty), mask=mask_kv)
        tl.store(VCache + slot * stride_vcs + offs_hk[:, None] * stride_vch + offs_d[None, :],
                 v.to(VCache.dtype.element_ty), mask=mask_kv)


def write_new_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary: RotaryArgs | None,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                 k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """An attention backend's first step: write this step's k/v into the cache, rotating q and k
    first when ``rotary`` is given (the backend fuses rotary). Returns q: rotated and contiguous,
    or as given."""
    if rotary is None:
        store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return q
    return rope_store_kv(q, k, v, rotary.positions, rotary.cos_sin, rotary.rotary_dim, k_cache,
                         v_cache, slot_mapping, k_scale, v_scale)


def rope_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  cos_sin: torch.Tensor, rotary_dim: int, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slot_mapping: torch.Tensor, k_scale: float = 1.0,
                  v_scale: float = 1.0) -> torch.Tensor:
    """Rotary embedding and the KV write in one launch (one program per token).

    q [T, H, D], k / v [T, Hkv, D] before rotary (any token and head strides, head dims
    contiguous: views into the fused QKV projection work as they are); positions [T];
    cos_sin [P, R] float32 (first half cos, second half sin, as ``rope_table``); caches
    [P, page, Hkv, D]. Writes rotated k and v at ``slot_mapping`` (negative: skipped) and returns
    the rotated q [T, H, D], contiguous. Computes in float32 and rounds once."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if cos_sin.stride(1) != 1:
        cos_sin = cos_sin.contiguous()
    kc = k_cache.view(-1, num_kv_heads, head_dim)
    vc = v_cache.view(-1, num_kv_heads, head_dim)
    _rope_store_kernel[(num_tokens,)](
        q, k, v, q_out, kc, vc, slot_mapping, positions, cos_sin, 1.0 / k_scale, 1.0 / v_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
        cos_sin.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_HKV=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), ROT=rotary_dim,
        SCALED=k_cache.dtype != k.dtype, QMAX=_qmax(k_cache.dtype),
        num_warps=4,
    )
    return q_out
