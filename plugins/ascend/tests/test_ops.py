"""The plugin's ops against plain-torch references written here from the core's contracts
(core/ops/*.py): attention over a paged cache for mixed batches, the layer ops against the
core's references, the linear methods against dense matmuls of the dequantised weights, the MoE
runner against a per-expert loop."""

from __future__ import annotations

import random

import pytest
import torch
from infer.core.ops.attention import AttentionConfig, AttentionMetadata
from infer.core.ops.layer_ops import rms_norm_ref, rotary_ref, silu_and_mul_ref
from infer.core.ops.linear import LinearConfig
from torch import nn

pytestmark = pytest.mark.usefixtures("npu_emulation")


def _reference_attention(q, k_cache, v_cache, meta, scale):
    """Each sequence's queries (absolute positions prefix..seq_len-1) over its cached keys at
    positions not after their own; caches [P, page, Hkv, D]."""
    out = torch.empty(q.shape, dtype=torch.float32)
    page = k_cache.shape[1]
    qsl = meta.query_start_loc.tolist()
    for i, (seq_len, ext) in enumerate(zip(meta.seq_lens_cpu, meta.extend_lens_cpu, strict=True)):
        pages = meta.block_tables[i, :-(-seq_len // page)].long().cpu()
        k = k_cache.cpu()[pages].reshape(-1, *k_cache.shape[2:])[:seq_len].float()
        v = v_cache.cpu()[pages].reshape(-1, *v_cache.shape[2:])[:seq_len].float()
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        qi = q[qsl[i]:qsl[i + 1]].cpu().float()
        s = torch.einsum("tnd,lnd->ntl", qi, k) * scale
        pos = torch.arange(seq_len - ext, seq_len)[:, None]
        s = s.masked_fill(torch.arange(seq_len)[None, :] > pos, float("-inf"))
        out[qsl[i]:qsl[i + 1]] = torch.einsum("ntl,lnd->tnd", s.softmax(-1), v)
    return out


def _batch(seq_lens, ext_lens, page, num_pages, device, seed=0):
    rng = random.Random(seed)
    free = list(range(1, num_pages))
    rng.shuffle(free)
    tables, slots = [], []
    for s, e in zip(seq_lens, ext_lens, strict=True):
        row = [free.pop() for _ in range(-(-s // page))]
        tables.append(row)
        slots += [row[p // page] * page + p % page for p in range(s - e, s)]
    width = max(len(r) for r in tables)
    qsl = [0]
    for e in ext_lens:
        qsl.append(qsl[-1] + e)
    i32 = dict(dtype=torch.int32, device=device)
    return AttentionMetadata(
        num_seqs=len(seq_lens), num_tokens=sum(ext_lens), page_size=page,
        query_start_loc=torch.tensor(qsl, **i32), seq_lens=torch.tensor(seq_lens, **i32),
        prefix_lens=torch.tensor([s - e for s, e in zip(seq_lens, ext_lens, strict=True)], **i32),
        block_tables=torch.tensor([r + [0] * (width - len(r)) for r in tables], **i32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        seq_lens_cpu=list(seq_lens), extend_lens_cpu=list(ext_lens), max_seq_len=max(seq_lens),
        max_extend_len=max(ext_lens))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page,seqs", [
    (128, [(1, 1), (300, 1), (129, 1)]),  # decode only (BSH)
    (128, [(40, 40), (200, 13), (77, 1), (260, 132)]),  # prefill, extend over a prefix, decode
    (256, [(300, 45), (5, 5)]),
])
def test_attention_matches_reference(device, dtype, page, seqs):
    from infer_ascend.ops.attention import AscendAttention

    torch.manual_seed(0)
    h, hkv, d, layers = 8, 2, 32, 2
    cfg = AttentionConfig(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=d ** -0.5,
                          page_size=page, dtype=dtype, kv_dtype=dtype, device=device,
                          num_layers=layers)
    backend = AscendAttention(cfg)
    seq_lens, ext = [s for s, _ in seqs], [e for _, e in seqs]
    meta = _batch(seq_lens, ext, page, 12, device)
    kc = torch.randn(12, page, hkv, d, dtype=dtype, device=device)  # old contents = the prefixes
    vc = torch.randn(12, page, hkv, d, dtype=dtype, device=device)
    t = sum(ext)
    q = torch.randn(t, h, d, dtype=dtype, device=device)
    k = torch.randn(t, hkv, d, dtype=dtype, device=device)
    v = torch.randn(t, hkv, d, dtype=dtype, device=device)
    backend.plan(meta)
    out = backend.forward(q, k, v, kc, vc, layer_id=0)
    flat = meta.slot_mapping.cpu()
    assert torch.equal(kc.view(-1, hkv, d)[flat].cpu(), k.cpu())  # new k/v landed at their slots
    assert torch.equal(vc.view(-1, hkv, d)[flat].cpu(), v.cpu())
    ref = _reference_attention(q, kc, vc, meta, d ** -0.5)
    torch.testing.assert_close(out.cpu().float(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("bad,match", [
    (dict(dtype=torch.float32), "--dtype"), (dict(page_size=16), "--page-size"),
    (dict(kv_dtype=torch.float8_e4m3fn), "--kv-cache-dtype"),
])
def test_attention_refuses_settings_the_kernels_cannot_take(device, bad, match):
    from infer_ascend.ops.attention import AscendAttention

    base = dict(num_heads=4, num_kv_heads=2, head_dim=16, scale=0.25, page_size=128,
                dtype=torch.float16, kv_dtype=torch.float16, device=device, num_layers=1)
    if "dtype" in bad:
        base["kv_dtype"] = bad["dtype"]
    with pytest.raises(ValueError, match=match):
        AscendAttention(AttentionConfig(**{**base, **bad}))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_ops_match_the_core_references(device, dtype):
    from infer_ascend.ops import layer_ops

    torch.manual_seed(0)
    x = torch.randn(5, 64, dtype=dtype, device=device)
    r = torch.randn(5, 64, dtype=dtype, device=device)
    w = (torch.rand(64, device=device) + 0.5).to(dtype)
    tol = dict(atol=2e-2, rtol=2e-2)
    for res in (None, r):
        got, got_res = layer_ops.rms_norm(x, w, 1e-6, res)
        want, want_res = rms_norm_ref(x, w, 1e-6, res)
        torch.testing.assert_close(got.float(), want.float(), **tol)
        assert (got_res is None) == (want_res is None)
        if want_res is not None:
            torch.testing.assert_close(got_res, want_res)
    g = torch.randn(5, 2 * 48, dtype=dtype, device=device)
    torch.testing.assert_close(layer_ops.silu_and_mul(g).float(), silu_and_mul_ref(g).float(), **tol)
    pos = torch.tensor([0, 3, 9, 1, 2], device=device)
    inv = 1.0 / (10000 ** (torch.arange(0, 32, 2, device=device).float() / 32))
    ang = torch.arange(16, device=device).float()[:, None] * inv[None]
    table = torch.cat([ang.cos(), ang.sin()], -1)  # [P, 32] float32, as RotaryEmbedding keeps it
    qkv = torch.randn(5, 6 * 32, dtype=dtype, device=device)  # q, k as strided views of a fused projection
    q, k = qkv[:, :128].view(5, 4, 32), qkv[:, 128:].view(5, 2, 32)
    want_q, want_k = rotary_ref(pos, q.clone(), k.clone(), table, 32)
    got_q, got_k = layer_ops.rotary(pos, q, k, table, 32)
    torch.testing.assert_close(got_q.float(), want_q.float(), **tol)
    torch.testing.assert_close(got_k.float(), want_k.float(), **tol)
    assert layer_ops.rotary(pos, q, k, table[:, :16], 16) is None  # partial rotary: reference


def _layer(method, n_out, n_in, bias, device, dtype):
    layer = nn.Module()
    method.create_weights(layer, n_in, n_out, bias)
    layer.weight.data.copy_(torch.randn(n_out, n_in, device=device) / n_in ** 0.5)
    if bias:
        layer.bias.data.copy_(torch.randn(n_out, device=device))
    return layer


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["w8a8_int8", "torchao:int8wo"])
def test_int8_linear_methods_match_dequantised_reference(device, dtype, name):
    from infer_ascend.ops.linear import Int8WeightOnlyLinear, W8A8DynamicLinear

    torch.manual_seed(0)
    cls = W8A8DynamicLinear if name == "w8a8_int8" else Int8WeightOnlyLinear
    method = cls(LinearConfig(quantization=name, dtype=dtype, device=device))
    layer = _layer(method, 48, 64, True, device, dtype)
    w = layer.weight.data.float().clone()
    method.process_weights_after_loading(layer)
    assert layer.weight is None and layer.qweight.dtype == torch.int8
    w_deq = layer.qweight.float() * layer.w_scale.float()[:, None]
    # half a step per channel, plus the rounding of a scale kept in the activation dtype
    bound = layer.w_scale.float()[:, None] / 2 + w.abs() * 2 ** -7 + 1e-6
    assert bool(((w_deq - w).abs() <= bound).all())
    x = torch.randn(2, 3, 64, dtype=dtype, device=device)
    out = method.apply(layer, x)
    assert out.shape == (2, 3, 48) and out.dtype == dtype
    if name == "w8a8_int8":  # activations quantized per token, symmetric int8
        xf = x.float().reshape(-1, 64)
        xs = xf.abs().amax(-1, keepdim=True) / 127
        xf = torch.round(xf / xs) * xs
    else:
        xf = x.float().reshape(-1, 64)
    ref = xf @ w_deq.t() + layer.bias.float()
    torch.testing.assert_close(out.float().reshape(-1, 48), ref, atol=3e-2, rtol=2e-2)
    exact = x.float().reshape(-1, 64) @ w.t() + layer.bias.float()
    assert (out.float().reshape(-1, 48) - exact).abs().max() < 0.1  # and near the float layer


def _moe_reference(x, w13, w2, weights, ids):
    out = torch.zeros(x.shape, dtype=torch.float32)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gu = w13[e].float() @ x[t].float()
            out[t] += weights[t, j].float() * (w2[e].float() @ (
                torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_moe_runner_matches_per_expert_loop(device, dtype):
    from infer_ascend.ops.moe import AscendMoERunner

    torch.manual_seed(0)
    t, d, inter, e, k = 7, 32, 24, 6, 2
    x = torch.randn(t, d, dtype=dtype, device=device)
    w13 = (torch.randn(e, 2 * inter, d, device=device) / d ** 0.5).to(dtype)
    w2 = (torch.randn(e, d, inter, device=device) / inter ** 0.5).to(dtype)
    probs = torch.softmax(torch.randn(t, e, device=device), -1)
    weights, ids = torch.topk(probs, k, -1)
    out = AscendMoERunner().apply(x, w13, w2, weights, ids)
    ref = _moe_reference(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu())
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [False, True])
def test_select_experts_matches_the_core_routing(device, dtype, renormalize):
    """The runner's routing hook against the core's (infer.core.ops.moe.softmax_topk, what the
    MoE layer runs without the hook): softmax in float32, top k, renormalised when asked."""
    from infer.core.ops.moe import softmax_topk
    from infer_ascend.ops.moe import AscendMoERunner

    torch.manual_seed(0)
    logits = torch.randn(9, 8, device=device).to(dtype)
    weights, ids = AscendMoERunner().select_experts(logits, 2, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    want_w, want_ids = softmax_topk(logits.cpu(), 2, renormalize)
    assert torch.equal(ids.long().cpu(), want_ids)
    torch.testing.assert_close(weights.cpu(), want_w, atol=1e-2, rtol=1e-2)
