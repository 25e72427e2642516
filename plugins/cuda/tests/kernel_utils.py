"""Shared helpers for the kernel tests: where to run, random paged batches, torch references."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

HAS_GPU = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# On a GPU the kernels run compiled; without one they run only under TRITON_INTERPRET=1 (CPU).
KERNEL_DEVICE = "cuda" if HAS_GPU and not INTERPRET else "cpu"
CAN_RUN_KERNELS = HAS_GPU or INTERPRET
SKIP_REASON = "Triton kernels need a CUDA GPU or TRITON_INTERPRET=1 (set it to run them on the CPU)"


def bf16_tol() -> float:
    """Relative-error bound for bf16 outputs. Compiled kernels: 1e-2. Triton's CPU interpreter
    converts float32 to bf16 by truncation (biased toward zero, measured: half of the values differ
    from round-to-nearest), which about doubles the error of multi-stage bf16 kernels: 3e-2."""
    return 3e-2 if INTERPRET else 1e-2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "output holds NaN/inf (unwritten or broken)"
    return ((out - ref).norm() / ref.norm()).item()


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, H, D]
    k_new: torch.Tensor  # [T, Hkv, D]
    v_new: torch.Tensor
    k_cache: torch.Tensor  # [P, page, Hkv, D], prefix already written, new slots poisoned
    v_cache: torch.Tensor
    prefix_lens: list[int]
    extend_lens: list[int]
    block_tables: torch.Tensor  # [B, max_pages] int32
    slot_mapping: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32


def make_paged_batch(prefix_lens: list[int], extend_lens: list[int], num_heads: int,
                     num_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype,
                     device: str, gen: torch.Generator) -> PagedBatch:
    """Random sequences whose pages are scattered (shuffled page ids) through a larger pool."""
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    pages_per_seq = [-(-s // page_size) for s in seq_lens]
    num_pages = sum(pages_per_seq) + 3
    perm = torch.randperm(num_pages, generator=gen).tolist()
    max_pages = max(pages_per_seq)
    block_tables = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    k_cache = torch.full((num_pages, page_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    T = sum(extend_lens)
    k_new = torch.randn(T, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_new = torch.randn(T, num_kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(T, num_heads, head_dim, generator=gen).to(dtype)
    slots, used = [], 0
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        pages = perm[used:used + pages_per_seq[b]]
        used += pages_per_seq[b]
        block_tables[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        for pos in range(p + e):
            slot = pages[pos // page_size] * page_size + pos % page_size
            if pos < p:
                k_cache.view(-1, num_kv_heads, head_dim)[slot] = torch.randn(
                    num_kv_heads, head_dim, generator=gen).to(dtype)
                v_cache.view(-1, num_kv_heads, head_dim)[slot] = torch.randn(
                    num_kv_heads, head_dim, generator=gen).to(dtype)
            else:
                slots.append(slot)
    qsl = torch.tensor([0] + extend_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    to = {"device": device}
    return PagedBatch(q.to(**to), k_new.to(**to), v_new.to(**to), k_cache.to(**to),
                      v_cache.to(**to), prefix_lens, extend_lens, block_tables.to(**to),
                      torch.tensor(slots, dtype=torch.int64, device=device), qsl.to(**to),
                      torch.tensor(seq_lens, dtype=torch.int32, device=device))


def reference_attention(pb: PagedBatch, scale: float) -> torch.Tensor:
    """Float64 causal attention over each sequence's gathered prefix + new tokens: [T, H, D]."""
    num_heads = pb.q.shape[1]
    hkv, d = pb.k_cache.shape[2], pb.k_cache.shape[3]
    page_size = pb.k_cache.shape[1]
    kf = pb.k_cache.view(-1, hkv, d).double().cpu()
    vf = pb.v_cache.view(-1, hkv, d).double().cpu()
    bt = pb.block_tables.cpu()
    outs, start = [], 0
    for b, (p, e) in enumerate(zip(pb.prefix_lens, pb.extend_lens, strict=True)):
        pos = torch.arange(p)
        slots = bt[b, pos // page_size].long() * page_size + pos % page_size
        k = torch.cat([kf[slots], pb.k_new[start:start + e].double().cpu()])  # [S, Hkv, D]
        v = torch.cat([vf[slots], pb.v_new[start:start + e].double().cpu()])
        q = pb.q[start:start + e].double().cpu()  # [E, H, D]
        g = num_heads // hkv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        s = torch.einsum("ehd,shd->hes", q, k) * scale  # [H, E, S]
        mask = torch.arange(p + e)[None, :] <= (p + torch.arange(e))[:, None]
        s = s.masked_fill(~mask, float("-inf"))
        outs.append(torch.einsum("hes,shd->ehd", s.softmax(-1), v))
        start += e
    return torch.cat(outs)
