"""A test-only paged driver on the Ascend page size: per-sequence page lists over one KV cache
(page 0 is left as the graph runner's scratch page), batches of (sequence, new tokens) built into
AttentionMetadata / ForwardBatch by hand, logits of every new token returned."""

from __future__ import annotations

import torch
from infer.core.ops.attention import AttentionMetadata, KVCache
from infer.core.ops.forward_batch import ForwardBatch

PAGE = 128


class Pages:
    """Per-sequence page lists over one KV cache; ``step`` runs a batch of (seq, tokens)."""

    def __init__(self, loaded, device, num_pages: int = 8) -> None:
        a = loaded.arch
        kv_heads = loaded.ctx.attn_backend.config.num_kv_heads  # this rank's (tensor parallel)
        shape = (num_pages, PAGE, kv_heads, a.head_dim)
        self.loaded, self.device = loaded, device
        self.kv = KVCache(k=[torch.zeros(shape, dtype=a.kv_dtype, device=device)
                             for _ in range(a.num_layers)],
                          v=[torch.zeros(shape, dtype=a.kv_dtype, device=device)
                             for _ in range(a.num_layers)])
        self.free = list(range(num_pages - 1, 0, -1))  # page 0: scratch
        self.pages: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def share_prefix(self, src: str, dst: str, n_pages: int) -> None:
        self.pages[dst] = list(self.pages[src][:n_pages])
        self.lens[dst] = n_pages * PAGE

    def step(self, work: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        ids, pos, slots, seq_lens, ext, tables = [], [], [], [], [], []
        for sid, toks in work:
            start = self.lens.get(sid, 0)
            pages = self.pages.setdefault(sid, [])
            while len(pages) * PAGE < start + len(toks):
                pages.append(self.free.pop())
            pos += range(start, start + len(toks))
            slots += [pages[p // PAGE] * PAGE + p % PAGE for p in range(start, start + len(toks))]
            ids += toks
            seq_lens.append(start + len(toks))
            ext.append(len(toks))
            tables.append(list(pages))
            self.lens[sid] = start + len(toks)
        width = max(len(t) for t in tables)
        qsl = [0]
        for e in ext:
            qsl.append(qsl[-1] + e)
        i32 = dict(dtype=torch.int32, device=self.device)
        meta = AttentionMetadata(
            num_seqs=len(work), num_tokens=len(ids), page_size=PAGE,
            query_start_loc=torch.tensor(qsl, **i32), seq_lens=torch.tensor(seq_lens, **i32),
            prefix_lens=torch.tensor([s - e for s, e in zip(seq_lens, ext, strict=True)], **i32),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], **i32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            seq_lens_cpu=seq_lens, extend_lens_cpu=ext, max_seq_len=max(seq_lens),
            max_extend_len=max(ext))
        i64 = dict(dtype=torch.int64, device=self.device)
        fwd = ForwardBatch(input_ids=torch.tensor(ids, **i64), positions=torch.tensor(pos, **i64),
                           attn=meta, logits_indices=torch.arange(len(ids), **i64),
                           kv_cache=self.kv)
        self.loaded.ctx.attn_backend.plan(meta)
        with torch.inference_mode():
            logits = self.loaded.model(fwd).cpu()
        return list(logits.split(ext))
