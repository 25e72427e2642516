"""Random paged-attention batches for the conformance kit.

A batch is a list of sequences, each ``(prefix, extend)``: ``prefix`` tokens already in the cache
(written there by the kit before the step, as an earlier step would have), ``extend`` new tokens
whose k/v the backend must write and whose queries it must attend over prefix + new keys. Pages
of every sequence are scattered at random over the pool; page 0 is never allocated (it is the
scratch page that padding rows and padded block-table entries point at), and each block-table row
carries at least one padding entry (page 0) past the sequence's pages. Every slot of the pool
holds random values, so a backend that reads a page or a slot it should not changes its output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from infer.core.ops.attention import AttentionMetadata

# name -> ((prefix, extend) per sequence, number of padding rows appended). A padding row is what
# graph runners add to fill a captured batch size: one token at position 0 whose k/v go to the
# scratch page 0. Padding rows all write the same scratch slot (in no defined order), so their
# outputs and page 0 are not compared; they must only leave every real row's result alone.
SCENARIOS: dict[str, tuple[list[tuple[int, int]], int]] = {
    "prefill": ([(0, 17), (0, 5), (0, 33)], 0),
    "decode": ([(30, 1), (7, 1), (64, 1), (0, 1), (19, 1)], 0),
    "decode-with-padding-rows": ([(30, 1), (45, 1)], 2),
    "extend-over-prefix": ([(12, 9), (40, 23), (3, 1)], 0),
    "mixed": ([(0, 9), (12, 1), (5, 4), (33, 1), (0, 1), (70, 16)], 0),
    "single-decode": ([(100, 1)], 0),
}


@dataclass
class PagedBatch:
    meta: AttentionMetadata
    positions: torch.Tensor  # [T] int64, absolute position of each new token
    num_pages: int
    real_tokens: torch.Tensor  # [T] bool: the token belongs to a real (not padding) row


def make_batch(seqs: list[tuple[int, int]], page_size: int, device: torch.device,
               gen: torch.Generator, is_padding: list[bool] | None = None) -> PagedBatch:
    """Metadata for ``seqs`` over a pool with room for all of them plus spare pages; rows marked
    in ``is_padding`` use page 0 for everything."""
    is_padding = is_padding or [False] * len(seqs)
    pages_of = [-(-(p + e) // page_size) for p, e in seqs]
    num_pages = sum(pages_of) + 3  # page 0 (scratch) and two pages nobody owns
    free = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    width = max(pages_of) + 1  # at least one padding entry in every row
    tables, slots, positions, real = [], [], [], []
    for (prefix, ext), n, pad in zip(seqs, pages_of, is_padding, strict=True):
        mine = [0] * n if pad else [free.pop() for _ in range(n)]
        tables.append(mine + [0] * (width - n))
        for pos in range(prefix, prefix + ext):
            slots.append(mine[pos // page_size] * page_size + pos % page_size)
            positions.append(pos)
            real.append(not pad)
    ext_lens = [e for _, e in seqs]
    seq_lens = [p + e for p, e in seqs]
    qsl = torch.tensor([0] + ext_lens).cumsum(0)
    meta = AttentionMetadata(
        num_seqs=len(seqs), num_tokens=sum(ext_lens), page_size=page_size,
        query_start_loc=qsl.to(torch.int32).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        prefix_lens=torch.tensor([p for p, _ in seqs], dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        seq_lens_cpu=seq_lens, extend_lens_cpu=ext_lens,
        max_seq_len=max(seq_lens), max_extend_len=max(ext_lens))
    return PagedBatch(meta, torch.tensor(positions, dtype=torch.int64, device=device), num_pages,
                      torch.tensor(real, dtype=torch.bool, device=device))


def scenario_batch(name: str, page_size: int, device: torch.device,
                   gen: torch.Generator) -> PagedBatch:
    seqs, padding = SCENARIOS[name]
    return make_batch(seqs + [(0, 1)] * padding, page_size, device, gen,
                      [False] * len(seqs) + [True] * padding)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 on the host; a non-finite output counts as infinite."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp(min=1e-30)).item()
