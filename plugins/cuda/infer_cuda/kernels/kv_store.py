# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Write new keys/values into the paged cache, Triton.

Token t's k/v [Hkv, D] go to flat slot slot_mapping[t] of [num_slots, Hkv, D]. A negative slot
means "padding row, write nothing": CUDA-graph padding rows use it so they never touch a page that
a real sequence owns. An fp8 cache stores value / scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
