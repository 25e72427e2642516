# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Paged decode attention with split-KV (flash-decoding), Triton.

One query token per sequence. Stage 1: program (b, kv_head, split) walks its share of the
sequence's pages for all query heads of that kv head (GQA group) and writes a partial output and
its log-sum-exp. Stage 2: program (b, head) merges the splits. The grid depends only on the batch
size and the fixed split count, never on sequence lengths, so a captured CUDA graph stays valid
when lengths change.

Cache layout: k_cache / v_cache [num_pages, page_size, Hkv, D]; block_tables [B, max_pages].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from infer_cuda.kernels.common import dot_precision, dot_upcast, interpreting
from infer_cuda.kernels.paged_kv import load_kv_tile

LOG2E = 1.4426950408889634


@triton.jit
def _decode_split_kernel(
    Q, K, V, BlockTables, SeqLens, OPart, LsePart,
    sm_scale_log2, k_scale, v_scale,
    stride_qb, stride_qh,
    stride_kslot, stride_kh, stride_vslot, stride_vh,
    stride_bt,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, KV_SCALED: tl.constexpr, DOT_PREC: tl.constexpr, DOT_F32: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(SeqLens + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)  # [G, D]
    if DOT_F32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_tile(K, V, BlockTables, b, stride_bt, kvh, offs_n, mask_n, offs_d, mask_d,
                            stride_kslot, stride_kh, stride_vslot, stride_vh, k_scale, v_scale, q,
                            PAGE_SIZE, KV_SCALED, DOT_F32)  # [N, D] each
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * sm_scale_log2  # [G, N], log2 units
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(OPart + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :],
             out, mask=mask_g[:, None] & mask_d[None, :])
    tl.store(LsePart + b * stride_lb + heads * stride_lh + split, lse, mask=mask_g)


@triton.jit
def _decode_merge_kernel(
    OPart, LsePart, Out,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_outb, stride_outh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(LsePart + b * stride_lb + h * stride_lh + offs_s, mask=mask_s,
                  other=float("-inf"))  # [S], log2 units
    m = tl.max(lse, 0)
    w = tl.where(mask_s & (lse > float("-inf")), tl.exp2(lse - m), 0.0)
    o = tl.load(OPart + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :],
                mask=mask_s[:, None] & mask_d[None, :], other=0.0)  # [S, D]
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + b * stride_outb + h * stride_outh + offs_d, out.to(Out.dtype.element_ty),
             mask=mask_d)


def pick_num_splits(batch: int, num_kv_heads: int, max_context_len: int, num_sms: int,
                    block_n: int = 64) -> int:
    """Splits per sequence so that batch * kv_heads * splits fills about four waves of SMs.

    Depends only on the batch size (and fixed config), so it is stable across graph replays."""
    want = max(1, triton.cdiv(4 * num_sms, max(1, batch * num_kv_heads)))
    useful = max(1, triton.cdiv(max_context_len, block_n))
    return int(min(want, useful, 64))


# (BLOCK_N, num_warps, num_stages) candidates for the split kernel, timed once per shape on a GPU
_CONFIGS = [(64, 4, 2), (32, 4, 2), (128, 4, 2), (64, 8, 3), (128, 8, 3), (32, 2, 2)]
_TUNED: dict[tuple, tuple[int, int, int]] = {}


def _tuned_config(key: tuple, launch: Callable[[tuple[int, int, int]], None]) -> tuple[int, int, int]:
    """Fastest split-kernel config for ``key``, timed on first use (never while a CUDA graph is
    being captured: the warm-up before capture fills the table). Interpreter: the default."""
    if key in _TUNED:
        return _TUNED[key]
    if interpreting() or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return _CONFIGS[0]
    from triton.testing import do_bench

    times = {}
    for cfg in _CONFIGS:
        try:
            times[cfg] = do_bench(lambda c=cfg: launch(c), warmup=5, rep=20)
        except Exception:  # a config the compiler rejects (resources): skip it
            continue
    _TUNED[key] = min(times, key=times.get) if times else _CONFIGS[0]
    return _TUNED[key]


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                     scale: float, num_splits: int, k_scale: float = 1.0, v_scale: float = 1.0,
                     block_n: int | None = None) -> torch.Tensor:
    """q [B, H, D]; caches [P, page, Hkv, D]; block_tables [B, max_pages]; seq_lens [B] (>= 1).

    Writes out [B, H, D] and returns it. ``block_n`` None: tuned per shape on a GPU."""
    bsz, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    kf = k_cache.view(-1, num_kv_heads, head_dim)
    vf = v_cache.view(-1, num_kv_heads, head_dim)
    o_part = torch.empty(bsz, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(bsz, num_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    kv_scaled = k_cache.dtype != q.dtype

    def launch(cfg: tuple[int, int, int]) -> None:
        bn, warps, stages = cfg
        _decode_split_kernel[(bsz, num_kv_heads, num_splits)](
            q, kf, vf, block_tables, seq_lens, o_part, lse_part,
            scale * LOG2E, k_scale, v_scale,
            q.stride(0), q.stride(1),
            kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1),
            block_tables.stride(0),
            o_part.stride(0), o_part.stride(1), o_part.stride(2),
            lse_part.stride(0), lse_part.stride(1),
            PAGE_SIZE=page_size, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=bn, NUM_SPLITS=num_splits,
            KV_SCALED=kv_scaled, DOT_PREC=dot_precision(q.dtype), DOT_F32=dot_upcast(q.dtype),
            num_warps=warps, num_stages=stages,
        )

    if block_n is not None:
        launch((block_n, 4, 2))
    else:
        key = (bsz, num_kv_heads, group, head_dim, page_size, num_splits, q.dtype, k_cache.dtype)
        launch(_tuned_config(key, launch))
    _decode_merge_kernel[(bsz, num_heads)](
        o_part, lse_part, out,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4,
    )
    return out
