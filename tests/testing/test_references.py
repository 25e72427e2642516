"""The core's plain-torch references (the conformance kit's yardstick) against naive dense formulas,
on every scenario of the kit's batches: attention as one softmax per query over the keys at
positions up to its own, MoE as a per-token loop, the dense linear as x @ W^T + b."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from infer.core.ops.attention import AttentionConfig
from infer.core.ops.linear import LinearConfig
from infer.core.ops.reference.attention import TorchNativeAttention
from infer.core.ops.reference.linear import DenseLinearMethod
from infer.core.ops.reference.moe import TorchMoERunner
from infer.core.testing.batches import SCENARIOS, scenario_batch

H, HKV, D = 4, 2, 16


def naive_attention(q, keys, vals, prefix):
    """q [E, H, D] at positions prefix.., keys/vals [S, Hkv, D] -> [E, H, D], in float64."""
    rep = H // HKV
    k, v = keys.double().repeat_interleave(rep, 1), vals.double().repeat_interleave(rep, 1)
    scores = torch.einsum("ehd,shd->hes", q.double(), k) * D ** -0.5
    allowed = torch.arange(k.shape[0])[None, :] <= (prefix + torch.arange(q.shape[0]))[:, None]
    return torch.einsum("hes,shd->ehd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_reference_attention_matches_naive_softmax(scenario, page_size):
    gen = torch.Generator().manual_seed(3)
    batch = scenario_batch(scenario, page_size, torch.device("cpu"), gen)
    meta = batch.meta
    k_cache = torch.randn(batch.num_pages, page_size, HKV, D, generator=gen)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(meta.num_tokens, H, D, generator=gen)
    k, v = torch.randn(meta.num_tokens, HKV, D, generator=gen), torch.randn(meta.num_tokens, HKV, D, generator=gen)
    backend = TorchNativeAttention(AttentionConfig(
        num_heads=H, num_kv_heads=HKV, head_dim=D, scale=D ** -0.5, page_size=page_size,
        dtype=torch.float32, kv_dtype=torch.float32, device=torch.device("cpu"), num_layers=1))
    backend.plan(meta)
    out = backend.forward(q, k, v, k_cache, v_cache, 0)
    flat_k, flat_v = k_cache.view(-1, HKV, D), v_cache.view(-1, HKV, D)
    real = batch.real_tokens  # padding rows share the scratch slot 0: not compared
    assert torch.equal(flat_k[meta.slot_mapping[real]], k[real])
    assert torch.equal(flat_v[meta.slot_mapping[real]], v[real])
    start = 0
    for i, (seq_len, ext) in enumerate(zip(meta.seq_lens_cpu, meta.extend_lens_cpu, strict=True)):
        if not real[start]:
            continue  # padding rows come last
        pages = meta.block_tables[i].long()
        slots = (pages[torch.arange(seq_len) // page_size] * page_size
                 + torch.arange(seq_len) % page_size)  # the sequence's slots in position order
        expect = naive_attention(q[start:start + ext], flat_k[slots], flat_v[slots], seq_len - ext)
        torch.testing.assert_close(out[start:start + ext].double(), expect, rtol=1e-5, atol=1e-5)
        start += ext


@pytest.mark.parametrize("top_k", [1, 2])
def test_reference_moe_matches_per_token_loop(top_k):
    gen = torch.Generator().manual_seed(0)
    t, d, i, e = 9, 16, 12, 5
    hidden = torch.randn(t, d, generator=gen)
    w13, w2 = torch.randn(e, 2 * i, d, generator=gen), torch.randn(e, d, i, generator=gen)
    weights, ids = torch.softmax(torch.randn(t, e, generator=gen), -1).topk(top_k, -1)
    out = TorchMoERunner().apply(hidden, w13, w2, weights, ids)
    for r in range(t):
        expect = sum(weights[r, j] * (w2[ids[r, j]] @ (F.silu(w13[ids[r, j], :i] @ hidden[r])
                                                     * (w13[ids[r, j], i:] @ hidden[r])))
                     for j in range(top_k))
        torch.testing.assert_close(out[r], expect, rtol=1e-4, atol=1e-4)


def test_reference_dense_linear():
    method = DenseLinearMethod(LinearConfig(None, torch.float32, torch.device("cpu")))
    layer = torch.nn.Module()
    method.create_weights(layer, 6, 3, bias=True)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(method.apply(layer, x), x @ layer.weight.t() + layer.bias)
