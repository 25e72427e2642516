# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Fused MoE, Triton: sort (token, slot) pairs by expert, two grouped GEMMs, top-k weighting.

Pairs: the T*k (token, choice) pairs, pair p = t * k + j routed to expert topk_ids[t, j].
``align_by_expert`` lays the pairs out expert by expert, each expert's run padded to a multiple
of BLOCK_M with the sentinel T*k, so every BLOCK_M rows of the sorted list belong to one expert.
All sizes are upper bounds computed from T, k and E alone: no device-to-host sync, and the launch
grid is fixed for a given T (CUDA-graph safe). Blocks past the used length get expert id E and
do no work.

    gemm1: inter[p] = w13[e] @ hidden[p // k]                         [T*k, 2I]
    act:   a[p] = silu(inter[p, :I]) * inter[p, I:]                   [T*k, I]
    gemm2: out_pairs[p] = topk_weights[p] * (w2[e] @ a[p])            [T*k, D]
    out[t] = sum_j out_pairs[t * k + j]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from infer_cuda.kernels.common import dot_precision, dot_upcast


@triton.jit
def _moe_gemm_kernel(
    A, B, C, SortedPairs, BlockExpert, TopkW,
    num_pairs, N, K,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    NUM_EXPERTS: tl.constexpr, A_ROW_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(BlockExpert + pid_m)
    active = expert < NUM_EXPERTS
    k_end = tl.where(active, K, 0)  # inactive block: empty K loop, nothing stored
    expert = tl.where(active, expert, 0).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(SortedPairs + offs_m)
    mask_m = (pairs < num_pairs) & active
    a_rows = (pairs // A_ROW_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    b_base = B + expert * stride_be + offs_n[None, :] * stride_bn
    for k0 in range(0, k_end, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        a = tl.load(A + a_rows[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)  # [M, K]
        b = tl.load(b_base + kk[:, None] * stride_bk,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)  # [K, N]
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, input_precision=DOT_PREC)
    if MUL_WEIGHT:
        w = tl.load(TopkW + pairs, mask=mask_m, other=0.0)
        acc = acc * w[:, None]
    tl.store(C + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn,
             acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs [max_rows] int32 with sentinel T*k, block_expert [max_rows / block_m] int32).

    Every block of ``block_m`` rows holds pairs of one expert; unused blocks carry expert E."""
    flat = topk_ids.reshape(-1).to(torch.int64)  # [P]
    num_pairs = flat.numel()
    max_rows = triton.cdiv(num_pairs + num_experts * (block_m - 1), block_m) * block_m
    # counts by scatter_add, not bincount: bincount reads its max on the host (breaks graphs)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # [E]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    count_start = counts.cumsum(0) - counts
    order = torch.argsort(flat, stable=True)  # pair ids grouped by expert
    experts_sorted = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - count_start[experts_sorted]
    dest = padded_start[experts_sorted] + rank
    sorted_pairs = torch.full((max_rows,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, max_rows, block_m, device=flat.device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True).to(torch.int32)
    return sorted_pairs, block_expert  # block_expert == E past the last used block


def _pick_blocks(num_pairs: int) -> tuple[int, int, int]:
    if num_pairs <= 64:
        return 16, 64, 128
    if num_pairs <= 1024:
        return 32, 64, 64
    return 64, 128, 64


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, sorted_pairs: torch.Tensor,
                  block_expert: torch.Tensor, topk_weights: torch.Tensor | None, a_row_div: int,
                  blocks: tuple[int, int, int]) -> None:
    bm, bn, bk = blocks
    num_experts, n, k = w.shape
    grid = (block_expert.numel(), triton.cdiv(n, bn))
    _moe_gemm_kernel[grid](
        a, w, out, sorted_pairs, block_expert,
        topk_weights if topk_weights is not None else out,
        out.shape[0], n, k,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
        out.stride(0), out.stride(1),
        NUM_EXPERTS=num_experts, A_ROW_DIV=a_row_div, MUL_WEIGHT=topk_weights is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        DOT_PREC=dot_precision(a.dtype), DOT_F32=dot_upcast(a.dtype),
        num_warps=4, num_stages=3,
    )


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """hidden [T, D]; w13 [E, 2I, D]; w2 [E, D, I]; topk_weights [T, k]; topk_ids [T, k] -> [T, D]."""
    num_tokens, top_k = topk_ids.shape
    num_experts, two_i, _ = w13.shape
    num_pairs = num_tokens * top_k
    blocks = _pick_blocks(num_pairs)
    sorted_pairs, block_expert = align_by_expert(topk_ids, num_experts, blocks[0])
    inter = torch.empty(num_pairs, two_i, dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(hidden, w13, inter, sorted_pairs, block_expert, None, top_k, blocks)
    act = F.silu(inter[:, : two_i // 2]) * inter[:, two_i // 2:]  # [P, I]
    out_pairs = torch.empty(num_pairs, w2.shape[1], dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    _grouped_gemm(act, w2, out_pairs, sorted_pairs, block_expert, weights, 1, blocks)
    return out_pairs.view(num_tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(hidden.dtype)
