"""A test-only paged runner: builds KVCache, AttentionMetadata and ForwardBatch by hand.

Sequences get pages from a free list (deliberately handed out in a shuffled order so pages of one
sequence are not contiguous). ``step`` runs one batch where each sequence contributes some new
tokens (a prompt chunk or one decode token) and returns logits for every new token.
"""

from __future__ import annotations

import random

import torch
from infer.core.ops.attention import AttentionMetadata, KVCache
from infer.core.ops.forward_batch import ForwardBatch


class PagedDriver:
    def __init__(self, loaded, page_size: int, num_pages: int = 512, seed: int = 0) -> None:
        self.loaded, self.page_size = loaded, page_size
        arch = loaded.arch
        shape = (num_pages, page_size, arch.num_kv_heads, arch.head_dim)
        self.kv = KVCache(k=[torch.zeros(shape, dtype=arch.kv_dtype) for _ in range(arch.num_layers)],
                          v=[torch.zeros(shape, dtype=arch.kv_dtype) for _ in range(arch.num_layers)])
        self.free = list(range(1, num_pages))  # page 0 stays unused (block-table padding)
        random.Random(seed).shuffle(self.free)
        self.pages: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, work: list[tuple[int, list[int]]], all_logits: bool = True) -> list[torch.Tensor]:
        """work: (seq_id, new token ids) per sequence -> logits [len(new), V] per sequence
        (only the last row when all_logits is False)."""
        ids, pos, slots, seq_lens, ext_lens, tables = [], [], [], [], [], []
        for sid, toks in work:
            prefix = self.lens.get(sid, 0)
            pages = self.pages.setdefault(sid, [])
            total = prefix + len(toks)
            while len(pages) * self.page_size < total:
                pages.append(self.free.pop())
            for j in range(len(toks)):
                p = prefix + j
                slots.append(pages[p // self.page_size] * self.page_size + p % self.page_size)
                pos.append(p)
            ids += toks
            seq_lens.append(total)
            ext_lens.append(len(toks))
            tables.append(list(pages))
            self.lens[sid] = total
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        qsl = torch.tensor([0] + ext_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        meta = AttentionMetadata(
            num_seqs=len(work), num_tokens=len(ids), page_size=self.page_size,
            query_start_loc=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            prefix_lens=torch.tensor([s - e for s, e in zip(seq_lens, ext_lens, strict=False)], dtype=torch.int32),
            block_tables=block_tables, slot_mapping=torch.tensor(slots, dtype=torch.int64),
            seq_lens_cpu=seq_lens, extend_lens_cpu=ext_lens, max_seq_len=max(seq_lens),
            max_extend_len=max(ext_lens))
        if all_logits:
            rows = list(range(len(ids)))
        else:
            rows = (qsl[1:] - 1).tolist()
        fwd = ForwardBatch(input_ids=torch.tensor(ids, dtype=torch.int64),
                           positions=torch.tensor(pos, dtype=torch.int64), attn=meta,
                           logits_indices=torch.tensor(rows, dtype=torch.int64), kv_cache=self.kv)
        self.loaded.ctx.attn_backend.plan(meta)
        with torch.no_grad():
            logits = self.loaded.model(fwd)
        out, start = [], 0
        for n in ext_lens:
            k = n if all_logits else 1
            out.append(logits[start:start + k])
            start += k
        return out


def run_greedy(driver: PagedDriver, prompts: list[list[int]], max_new: int, chunk: int,
               stagger: int = 1) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decoding of every prompt through mixed batches: sequence i joins at step
    i * stagger, prefills in chunks of ``chunk`` tokens while others decode. Returns the
    generated ids and, per sequence, logits for every position it processed [L, V]."""
    gen: list[list[int]] = [[] for _ in prompts]
    fed = [0] * len(prompts)  # prompt tokens already in the cache
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    step = 0
    while any(len(g) < max_new for g in gen):
        work = []
        for i, p in enumerate(prompts):
            if step < i * stagger or len(gen[i]) >= max_new:
                continue
            if fed[i] < len(p):
                toks = p[fed[i]:fed[i] + chunk]
                fed[i] += len(toks)
            else:
                toks = [gen[i][-1]]
            work.append((i, toks))
        for (i, _), logits in zip(work, driver.step(work), strict=True):
            rows[i].append(logits)
            if fed[i] == len(prompts[i]):
                gen[i].append(int(logits[-1].argmax()))
        step += 1
    return gen, [torch.cat(r) for r in rows]
