"""The CPU plugin's torch_native attention (the core's reference plus the native paged-decode
kernel) against naive dense formulas, for any mix of prefill, chunked-extend and decode rows
(pages scattered, page sizes 1 and 4). The core's MoE and dense-linear references are checked the
same way in tests/testing/test_references.py."""

from __future__ import annotations

import pytest
import torch
from infer.core.ops.attention import AttentionConfig, AttentionMetadata
from infer_cpu.ops.attention import TorchNativeAttention

H, HKV, D = 4, 2, 8


def naive_attention(q, k, v, prefix):
    """q [E, H, D] at positions prefix.., k/v [S, Hkv, D] all keys -> [E, H, D]."""
    rep = H // HKV
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("ehd,shd->hes", q, k) / D ** 0.5
    allowed = torch.arange(k.shape[0])[None, :] <= (prefix + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hes,shd->ehd", scores.softmax(-1), v)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("prefix_ext", [
    [(0, 7), (5, 1), (9, 4), (3, 1)],  # prefill, decode, chunked extend, decode
    [(6, 1), (2, 1), (11, 1)],  # decode only (the batched path)
    [(0, 5)],  # a single prefill
])
def test_paged_attention_matches_dense(page_size, prefix_ext):
    gen = torch.Generator().manual_seed(page_size)
    num_pages = 64
    cfg = AttentionConfig(num_heads=H, num_kv_heads=HKV, head_dim=D, scale=D ** -0.5,
                          page_size=page_size, dtype=torch.float32, kv_dtype=torch.float32,
                          device=torch.device("cpu"), num_layers=1)
    k_cache = torch.zeros(num_pages, page_size, HKV, D)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_pages - 1, generator=gen).add(1).tolist()
    tables, slots, seqs = [], [], []
    for prefix, ext in prefix_ext:
        total = prefix + ext
        pages = [free.pop() for _ in range(-(-total // page_size))]
        keys, vals = torch.randn(total, HKV, D, generator=gen), torch.randn(total, HKV, D, generator=gen)
        for p in range(prefix):  # the cached prefix
            k_cache[pages[p // page_size], p % page_size] = keys[p]
            v_cache[pages[p // page_size], p % page_size] = vals[p]
        slots += [pages[p // page_size] * page_size + p % page_size for p in range(prefix, total)]
        tables.append(pages)
        seqs.append((prefix, ext, keys, vals, torch.randn(ext, H, D, generator=gen)))
    width = max(map(len, tables))
    ext_lens = [e for _, e in prefix_ext]
    seq_lens = [p + e for p, e in prefix_ext]
    meta = AttentionMetadata(
        num_seqs=len(seqs), num_tokens=sum(ext_lens), page_size=page_size,
        query_start_loc=torch.tensor([0] + ext_lens).cumsum(0).int(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        prefix_lens=torch.tensor([p for p, _ in prefix_ext], dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots), seq_lens_cpu=seq_lens, extend_lens_cpu=ext_lens,
        max_seq_len=max(seq_lens), max_extend_len=max(ext_lens))
    backend = TorchNativeAttention(cfg)
    backend.plan(meta)
    q = torch.cat([s[4] for s in seqs])
    k_new = torch.cat([s[2][s[0]:] for s in seqs])
    v_new = torch.cat([s[3][s[0]:] for s in seqs])
    out = backend.forward(q, k_new, v_new, k_cache, v_cache, 0)
    start = 0
    for prefix, ext, keys, vals, qs in seqs:
        torch.testing.assert_close(out[start:start + ext], naive_attention(qs, keys, vals, prefix),
                                   rtol=1e-5, atol=1e-5)
        start += ext
    flat_k = k_cache.view(-1, HKV, D)
    torch.testing.assert_close(flat_k[meta.slot_mapping], k_new)  # new keys written at their slots

