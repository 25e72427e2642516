# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Paged decode attention with split-KV (flash-decoding), Triton.

One query token per sequence. Stage 1: program (b, kv_head, split) walks its share of the
sequence's pages for all query heads of that kv head (GQA group) and writes a partial output and
its log-sum-exp. Stage 2 merges the splits, in one of two ways:
- a second kernel, program (b, head);
- in the same launch ("fused merge"): each split program takes a ticket from a per-(b, kv_head)
  counter after writing its partials, and the one that draws the last ticket merges the group's
  splits and resets the counter to 0 (so the counters stay valid across CUDA-graph replays). This
  saves a launch per layer, which is most of the merge's cost at batch 1 (an H100 profile: 3 us of
  a 6.4 us attention). Which one runs is timed per shape on a GPU with the block sizes.
The grid depends only on the batch size and the fixed split count, never on sequence lengths, so
a captured CUDA graph stays valid when lengths change.

Cache layout: k_cache / v_cache [num_pages, page_size, Hkv, D]; block_tables [B, max_pages].
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from infer_cuda.kernels.common import arrival_counters, dot_precision, dot_upcast, interpreting
from infer_cuda.kernels.paged_kv import load_kv_tile

logger = logging.getLogger(__name__)
LOG2E = 1.4426950408889634


@triton.jit
def _decode_split_kernel(
    Q, K, V, BlockTables, SeqLens, OPart, LsePart, Out, Counters,
    sm_scale_log2, k_scale, v_scale,
    stride_qb, stride_qh,
    stride_kslot, stride_kh, stride_vslot, stride_vh,
    stride_bt,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_outb, stride_outh, num_kv_heads,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, KV_SCALED: tl.constexpr, DOT_PREC: tl.constexpr, DOT_F32: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
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

    if FUSED_MERGE:
        tl.debug_barrier()  # every thread's partial stores precede the ticket (release below)
        counter = Counters + b * num_kv_heads + kvh
        ticket = tl.atomic_add(counter, 1, sem="acq_rel")
        if ticket == NUM_SPLITS - 1:  # the last split of this (b, kv_head) to finish merges
            # only splits that start inside the sequence hold data (the rest wrote lse -inf)
            num_active = tl.cdiv(seq_len, tl.maximum(split_len, 1))  # seq_len 0: none
            m = tl.full([BLOCK_G], float("-inf"), tl.float32)
            for s in range(0, num_active):
                lse_s = tl.load(LsePart + b * stride_lb + heads * stride_lh + s, mask=mask_g,
                                other=float("-inf"), cache_modifier=".cg")
                m = tl.maximum(m, lse_s)
            m = tl.where(m > float("-inf"), m, 0.0)
            w_sum = tl.zeros([BLOCK_G], tl.float32)
            merged = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
            for s in range(0, num_active):
                lse_s = tl.load(LsePart + b * stride_lb + heads * stride_lh + s, mask=mask_g,
                                other=float("-inf"), cache_modifier=".cg")
                w = tl.exp2(lse_s - m)  # 0 for an empty split (lse -inf)
                o_s = tl.load(OPart + b * stride_ob + heads[:, None] * stride_oh + s * stride_os
                              + offs_d[None, :], mask=mask_g[:, None] & mask_d[None, :],
                              other=0.0, cache_modifier=".cg")
                merged += o_s * w[:, None]
                w_sum += w
            merged = merged / tl.where(w_sum > 0, w_sum, 1.0)[:, None]
            tl.store(Out + b * stride_outb + heads[:, None] * stride_outh + offs_d[None, :],
                     merged.to(Out.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
            tl.atomic_xchg(counter, 0)  # ready for the next launch (graph replays reuse it)


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


# (BLOCK_N, num_warps, num_stages, fused merge) candidates, timed once per shape on a GPU
Config = tuple[int, int, int, bool]
_BLOCKS = [(64, 4, 2), (32, 4, 2), (128, 4, 2), (64, 8, 3), (128, 8, 3), (32, 2, 2)]
_CONFIGS: list[Config] = [(*blk, False) for blk in _BLOCKS] + [(*blk, True) for blk in _BLOCKS]
_TUNED: dict[tuple, Config] = {}
def _tuned_config(key: tuple, launch: Callable[[Config], None], out: torch.Tensor) -> Config:
    """Fastest config for ``key``, timed on first use (never while a CUDA graph is being
    captured: the warm-up before capture fills the table). Interpreter: the default.

    A fused-merge config is kept only if its output agrees with the two-kernel one on this very
    input: a merge that read another program's partials too early would be caught here, on the
    GPU it runs on, rather than trusted."""
    if key in _TUNED:
        return _TUNED[key]
    if interpreting() or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return _CONFIGS[0]
    from triton.testing import do_bench

    launch(_CONFIGS[0])
    expect = out.float()
    times = {}
    for cfg in _CONFIGS:
        try:
            times[cfg] = do_bench(lambda c=cfg: launch(c), warmup=5, rep=20)
        except Exception:  # a config the compiler rejects (resources): skip it
            continue
        if cfg[3] and not torch.allclose(out.float(), expect, rtol=1e-2, atol=1e-3):
            logger.warning("decode attention: fused-merge config %s disagrees with the two-kernel "
                           "merge; not used", cfg)
            del times[cfg]
    _TUNED[key] = min(times, key=times.get) if times else _CONFIGS[0]
    return _TUNED[key]


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                     scale: float, num_splits: int, k_scale: float = 1.0, v_scale: float = 1.0,
                     block_n: int | None = None, fused_merge: bool = False) -> torch.Tensor:
    """q [B, H, D]; caches [P, page, Hkv, D]; block_tables [B, max_pages]; seq_lens [B] (>= 1).

    Writes out [B, H, D] and returns it. ``block_n`` None: block sizes and the merge mode are
    tuned per shape on a GPU; else that block size with ``fused_merge`` as given."""
    bsz, num_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    kf = k_cache.view(-1, num_kv_heads, head_dim)
    vf = v_cache.view(-1, num_kv_heads, head_dim)
    o_part = torch.empty(bsz, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(bsz, num_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    kv_scaled = k_cache.dtype != q.dtype

    counters = arrival_counters(q.device, bsz * num_kv_heads)

    def launch(cfg: Config) -> None:
        bn, warps, stages, fused = cfg
        fused = fused and num_splits > 1
        _decode_split_kernel[(bsz, num_kv_heads, num_splits)](
            q, kf, vf, block_tables, seq_lens, o_part, lse_part, out, counters,
            scale * LOG2E, k_scale, v_scale,
            q.stride(0), q.stride(1),
            kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1),
            block_tables.stride(0),
            o_part.stride(0), o_part.stride(1), o_part.stride(2),
            lse_part.stride(0), lse_part.stride(1), out.stride(0), out.stride(1), num_kv_heads,
            PAGE_SIZE=page_size, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=bn, NUM_SPLITS=num_splits,
            KV_SCALED=kv_scaled, DOT_PREC=dot_precision(q.dtype), DOT_F32=dot_upcast(q.dtype),
            FUSED_MERGE=fused, num_warps=warps, num_stages=stages,
        )
        if not fused:
            merge()

    def merge() -> None:
        _decode_merge_kernel[(bsz, num_heads)](
            o_part, lse_part, out,
            o_part.stride(0), o_part.stride(1), o_part.stride(2),
            lse_part.stride(0), lse_part.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4,
        )

    if block_n is not None:
        launch((block_n, 4, 2, fused_merge))
    else:
        key = (bsz, num_kv_heads, group, head_dim, page_size, num_splits, q.dtype, k_cache.dtype)
        launch(_tuned_config(key, launch, out))
    return out
