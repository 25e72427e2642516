# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Paged extend (prefill) attention, Triton: new tokens attend to the cached prefix plus
themselves, causally.

The backend writes the new keys/values into the cache first, so every key a query needs lives in
the paged cache: query i of sequence b (absolute position prefix_b + i) attends to cache positions
0..prefix_b + i. Program (m_block, head, b) handles BLOCK_M queries of one head; its key loop stops
at the last position any of its queries can see. Rows of a sequence are
query_start_loc[b]:query_start_loc[b+1] of the packed q / out.

CUDA graphs: the grid depends only on ``max_extend_len`` and the number of sequences (host), never
on the lengths, prefixes or pages (device tensors), so an extend graph captured with
``max_extend_len`` = its token bucket N replays for any real length n <= N. Rows after the last
sequence's extent (a graph's padding rows, query_start_loc[B] <= row < T, within the last
sequence's max_extend_len rows) are written as zeros, so they stay finite through the model.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer_cuda.kernels.common import dot_precision, dot_upcast
from infer_cuda.kernels.paged_kv import load_kv_tile

LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    Q, K, V, Out, QueryStart, PrefixLens, BlockTables, num_tokens,
    sm_scale_log2, k_scale, v_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kslot, stride_kh, stride_vslot, stride_vh,
    stride_bt,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_SCALED: tl.constexpr, DOT_PREC: tl.constexpr, DOT_F32: tl.constexpr,
):
    mblk = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // GROUP

    q_start = tl.load(QueryStart + b)
    ext_len = tl.load(QueryStart + b + 1) - q_start
    prefix = tl.load(PrefixLens + b)

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < ext_len
    mask_d = offs_d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(Q + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [M, D]
    if DOT_F32:
        q = q.to(tl.float32)
    q_pos = prefix + offs_m  # absolute positions of these queries

    # keys this block can see: up to the last valid query's position (none if the block is empty)
    kv_end = prefix + tl.minimum(ext_len, (mblk + 1) * BLOCK_M)
    kv_end = tl.where(mblk * BLOCK_M < ext_len, kv_end, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        k, v = load_kv_tile(K, V, BlockTables, b, stride_bt, kvh, offs_n, mask_n, offs_d, mask_d,
                            stride_kslot, stride_kh, stride_vslot, stride_vh, k_scale, v_scale, q,
                            PAGE_SIZE, KV_SCALED, DOT_F32)  # [N, D] each
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * sm_scale_log2  # [M, N]
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out = tl.where(mask_m[:, None], out, 0.0)
    # padding rows after the last sequence (T > query_start_loc[B]) get zeros
    tail = (b == tl.num_programs(2) - 1) & (offs_m >= ext_len) & (rows < num_tokens)
    tl.store(Out + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=(mask_m | tail)[:, None] & mask_d[None, :])


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     query_start_loc: torch.Tensor, prefix_lens: torch.Tensor,
                     block_tables: torch.Tensor, max_extend_len: int, out: torch.Tensor,
                     scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                     block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """q [T, H, D] packed new tokens; caches [P, page, Hkv, D] already holding the new k/v.

    Writes out [T, H, D] and returns it: the sequences' rows, plus zeros in rows
    query_start_loc[B] .. T-1 that lie within max_extend_len rows of the last sequence's start."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    bsz = prefix_lens.shape[0]
    kf = k_cache.view(-1, num_kv_heads, head_dim)
    vf = v_cache.view(-1, num_kv_heads, head_dim)
    block_m = min(block_m, max(16, triton.next_power_of_2(max_extend_len)))
    grid = (triton.cdiv(max_extend_len, block_m), num_heads, bsz)
    _extend_kernel[grid](
        q, kf, vf, out, query_start_loc, prefix_lens, block_tables, q.shape[0],
        scale * LOG2E, k_scale, v_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1),
        block_tables.stride(0),
        PAGE_SIZE=page_size, GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_N=block_n,
        KV_SCALED=k_cache.dtype != q.dtype,
        DOT_PREC=dot_precision(q.dtype), DOT_F32=dot_upcast(q.dtype),
        num_warps=4, num_stages=2,
    )
    return out
