"""The torch_npu emulation's own semantics, op by op, against hand-computed expectations: layouts
(TND/BSH, [blocks, block_size, KV_N, D]), int32 indices, host-side lengths, cumulative vs count
group lists. A plugin call built on a wrong assumption must fail here (error or other result),
not agree with an emulation that shares the assumption. Skipped on real hardware (these test the
emulation, not the NPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import HARDWARE

pytestmark = [pytest.mark.skipif(HARDWARE, reason="tests of the emulation itself"),
              pytest.mark.usefixtures("npu_emulation")]


@pytest.fixture()
def tnpu():
    import torch_npu

    return torch_npu


def test_reshape_and_cache_writes_slots_and_wants_int32(tnpu):
    kc = torch.zeros(3, 128, 2, 16, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    k = torch.randn(2, 2, 16, dtype=torch.float16)
    v = torch.randn(2, 2, 16, dtype=torch.float16)
    slots = torch.tensor([2 * 128 + 5, 0 * 128 + 127], dtype=torch.int32)
    tnpu._npu_reshape_and_cache(k, v, kc, vc, slots)
    assert torch.equal(kc[2, 5], k[0]) and torch.equal(kc[0, 127], k[1])
    assert torch.equal(vc[2, 5], v[0]) and kc.count_nonzero() == k.count_nonzero()
    with pytest.raises(TypeError, match="slot_indices"):
        tnpu._npu_reshape_and_cache(k, v, kc, vc, slots.long())
    with pytest.raises(ValueError, match="num_blocks, block_size"):
        tnpu._npu_reshape_and_cache(k, v, kc.view(3, 128, 32), vc.view(3, 128, 32), slots)


def _paged(seqs_k, seqs_v, block=128, blocks=6):
    """Caches [blocks, block, KV_N*D] holding each sequence in the pages of its table row."""
    hkv, d = seqs_k[0].shape[1:]
    kc = torch.zeros(blocks, block, hkv * d, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    tables, free = [], list(range(blocks - 1, 0, -1))
    for k, v in zip(seqs_k, seqs_v, strict=True):
        row = [free.pop(0) for _ in range(-(-k.shape[0] // block))]
        for j in range(k.shape[0]):
            kc[row[j // block], j % block] = k[j].reshape(-1)
            vc[row[j // block], j % block] = v[j].reshape(-1)
        tables.append(row + [0] * (2 - len(row)))
    return kc, vc, torch.tensor(tables, dtype=torch.int32)


def _expected(q, k, v, scale, causal_from):
    """q [S, N, D], k/v [L, KV_N, D]; query i sees keys j <= causal_from + i (None: all)."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = torch.einsum("snd,lnd->nsl", q.float(), kk) * scale
    if causal_from is not None:
        i = torch.arange(q.shape[0])[:, None]
        j = torch.arange(k.shape[0])[None, :]
        s = s.masked_fill(j > causal_from + i, float("-inf"))
    return torch.einsum("nsl,lnd->snd", s.softmax(-1), vv)


def test_fia_bsh_decode_reads_pages_by_table(tnpu):
    torch.manual_seed(0)
    lens = [130, 7]
    ks = [torch.randn(n, 2, 16, dtype=torch.float16) for n in lens]
    vs = [torch.randn(n, 2, 16, dtype=torch.float16) for n in lens]
    kc, vc, table = _paged(ks, vs)
    q = torch.randn(2, 1, 4 * 16, dtype=torch.float16)  # BSH: [B, 1, N*D]
    out, _ = tnpu.npu_fused_infer_attention_score(
        q, kc, vc, block_table=table, block_size=128, num_heads=4, num_key_value_heads=2,
        scale=0.25, input_layout="BSH", actual_seq_lengths_kv=lens)
    for b in range(2):
        ref = _expected(q[b].view(1, 4, 16), ks[b], vs[b], 0.25, None)
        torch.testing.assert_close(out[b].view(1, 4, 16).float(), ref, atol=2e-3, rtol=2e-3)


def _mask():
    return torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def test_fia_tnd_extend_is_right_down_causal_with_cumulative_q_and_plain_kv(tnpu):
    torch.manual_seed(1)
    kv_lens, q_lens = [140, 9], [12, 9]  # seq 0: 128 cached + 12 new; seq 1: fresh prompt
    ks = [torch.randn(n, 2, 16, dtype=torch.float16) for n in kv_lens]
    vs = [torch.randn(n, 2, 16, dtype=torch.float16) for n in kv_lens]
    kc, vc, table = _paged(ks, vs)
    q = torch.randn(sum(q_lens), 4, 16, dtype=torch.float16)
    args = dict(block_table=table, block_size=128, num_heads=4, num_key_value_heads=2, scale=0.3,
                input_layout="TND", atten_mask=_mask(), sparse_mode=3)
    out, _ = tnpu.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths=[12, 21],
                                                  actual_seq_lengths_kv=kv_lens, **args)
    ref0 = _expected(q[:12], ks[0], vs[0], 0.3, 140 - 12)
    ref1 = _expected(q[12:], ks[1], vs[1], 0.3, 0)
    torch.testing.assert_close(out.float(), torch.cat([ref0, ref1]), atol=2e-3, rtol=2e-3)
    # per-sequence query lengths where cumulative ones belong: refused (not non-decreasing)
    with pytest.raises(ValueError, match="cumulative"):
        tnpu.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths=[12, 9],
                                             actual_seq_lengths_kv=kv_lens, **args)
    # cumulative KV lengths where per-sequence ones belong: a different (wrong) answer
    wrong, _ = tnpu.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths=[12, 21],
                                                    actual_seq_lengths_kv=[140, 149], **args)
    assert not torch.allclose(wrong.float(), out.float(), atol=1e-2)


@pytest.mark.parametrize("bad,match", [
    (dict(block_size=16), "multiple of 128"),
    (dict(block_table="int64"), "block_table"),
    (dict(actual_seq_lengths_kv="tensor"), "host list"),
    (dict(atten_mask=None), "2048x2048"),
    (dict(atten_mask="lower"), "2048x2048"),
    (dict(query="float32"), "query"),
])
def test_fia_refuses_wrong_arguments(tnpu, bad, match):
    ks = [torch.randn(5, 1, 16, dtype=torch.float16)]
    kc, vc, table = _paged(ks, ks)
    args = dict(block_table=table[:, :1], block_size=128, num_heads=2, num_key_value_heads=1,
                scale=1.0, input_layout="TND", atten_mask=_mask(), sparse_mode=3,
                actual_seq_lengths=[5], actual_seq_lengths_kv=[5])
    q = torch.randn(5, 2, 16, dtype=torch.float16)
    if "block_size" in bad:
        args["block_size"] = bad["block_size"]
    if bad.get("block_table") == "int64":
        args["block_table"] = args["block_table"].long()
    if bad.get("actual_seq_lengths_kv") == "tensor":
        args["actual_seq_lengths_kv"] = torch.tensor([5], dtype=torch.int32)
    if "atten_mask" in bad:
        args["atten_mask"] = None if bad["atten_mask"] is None else _mask().t()
    if bad.get("query") == "float32":
        q = q.float()
    with pytest.raises((ValueError, TypeError), match=match):
        tnpu.npu_fused_infer_attention_score(q, kc, vc, **args)


def test_rms_norms_and_their_output_order(tnpu):
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    g = torch.rand(8) + 0.5
    y, rstd = tnpu.npu_rms_norm(x, g, 1e-6)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    torch.testing.assert_close(y, want)
    assert rstd.shape == (3, 1)
    y2, rstd2, s = tnpu.npu_add_rms_norm(x, r, g, 1e-6)  # (y, rstd, x1 + x2)
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(y2, tnpu.npu_rms_norm(x + r, g, 1e-6)[0])
    assert rstd2.shape == (3, 1)


def test_swiglu_gates_with_the_first_half(tnpu):
    x = torch.randn(4, 10)
    torch.testing.assert_close(tnpu.npu_swiglu(x, dim=-1), F.silu(x[:, :5]) * x[:, 5:])


def test_rotary_neox_in_place_and_table_dtype(tnpu):
    t, d = 3, 8
    pos = torch.tensor([0, 5, 2])
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(8).float()[:, None] * inv[None]
    table = torch.cat([ang.cos(), ang.sin()], -1).half()  # [P, d]: cos half, sin half
    q = torch.randn(t, 2 * d).half()
    k = torch.randn(t, d).half()
    q0, k0 = q.clone(), k.clone()
    assert tnpu._npu_rotary_embedding(pos, q, k, d, table, True) is None  # in place
    c, s = ang[pos].cos(), ang[pos].sin()
    x1, x2 = q0.float().view(t, 2, d)[..., :4], q0.float().view(t, 2, d)[..., 4:]
    want = torch.cat([x1 * c[:, None] - x2 * s[:, None], x2 * c[:, None] + x1 * s[:, None]], -1)
    torch.testing.assert_close(q.float().view(t, 2, d), want, atol=5e-3, rtol=5e-3)
    assert not torch.equal(k, k0)
    with pytest.raises(ValueError, match="dtype"):
        tnpu._npu_rotary_embedding(pos, q, k, d, table.float(), True)
    gptj = q0.clone()
    tnpu._npu_rotary_embedding(pos, gptj, k0.clone(), d, table, False)
    assert not torch.allclose(gptj.float(), q.float(), atol=1e-2)


def test_dynamic_quant_is_per_token(tnpu):
    x = torch.tensor([[1.0, -2.0, 0.5], [100.0, 3.0, -50.0]], dtype=torch.float16)
    y, scale = tnpu.npu_dynamic_quant(x)
    torch.testing.assert_close(scale, torch.tensor([2.0 / 127, 100.0 / 127]))
    assert y.dtype == torch.int8 and y[0, 1] == -127 and y[1, 0] == 127
    assert y[0, 0] == round(1.0 / (2.0 / 127))


def test_quant_matmul_layout_and_bias_order(tnpu):
    x = torch.randint(-5, 5, (2, 3), dtype=torch.int8)
    w = torch.randint(-5, 5, (4, 3), dtype=torch.int8)  # [N, K]
    scale = torch.tensor([0.5, 1.0, 2.0, 0.25])
    pt = torch.tensor([1.0, 3.0])
    out = tnpu.npu_quant_matmul(x, w.t(), scale, pertoken_scale=pt, output_dtype=torch.float16)
    want = (x.float() @ w.float().t()) * scale * pt[:, None]
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-3)
    with pytest.raises(ValueError, match="x2"):
        tnpu.npu_quant_matmul(x, w, scale, output_dtype=torch.float16)  # [N, K] is not [K, N]
    ib = torch.tensor([1, 0, 0, 0], dtype=torch.int32)  # int32 bias: before the scale
    fb = torch.tensor([1.0, 0, 0, 0])  # float bias: after it
    bf = torch.bfloat16
    oi = tnpu.npu_quant_matmul(x, w.t(), scale, bias=ib, output_dtype=bf)
    of = tnpu.npu_quant_matmul(x, w.t(), scale, bias=fb, output_dtype=bf)
    base = tnpu.npu_quant_matmul(x, w.t(), scale, output_dtype=bf)
    torch.testing.assert_close((oi - base)[:, 0].float(), torch.full((2,), 0.5))
    torch.testing.assert_close((of - base)[:, 0].float(), torch.full((2,), 1.0))


def test_quant_matmul_float16_without_pertoken_takes_the_int64_scale(tnpu):
    """The document's dtype table: a float16 output with no per-token scale needs the int64
    scale of npu_trans_quant_param (modelslim's deq_scale of float16 models) and an int32 bias."""
    x = torch.randint(-5, 5, (2, 3), dtype=torch.int8)
    w = torch.randint(-5, 5, (3, 4), dtype=torch.int8)
    scale = torch.tensor([0.5, 1.0, 2.0, 0.25])
    with pytest.raises(TypeError, match="scale"):
        tnpu.npu_quant_matmul(x, w, scale, output_dtype=torch.float16)
    s64 = tnpu.npu_trans_quant_param(scale)
    assert s64.dtype == torch.int64 and s64[1].item() == 0x3F800000  # 1.0f's bits, low word
    ib = torch.tensor([4, 0, 0, 0], dtype=torch.int32)
    out = tnpu.npu_quant_matmul(x, w, s64, bias=ib, output_dtype=torch.float16)
    want = (x.float() @ w.float() + ib.float()) * scale
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-3)
    with pytest.raises(TypeError, match="bias"):
        tnpu.npu_quant_matmul(x, w, s64, bias=ib.half(), output_dtype=torch.float16)
    with pytest.raises(TypeError, match="scale"):  # bfloat16 output: float32/bfloat16 scale
        tnpu.npu_quant_matmul(x, w, s64, output_dtype=torch.bfloat16)


def test_quantize_multiplies_adds_the_offset_rounds_and_saturates(tnpu):
    """div_mode False: y = round(x * scales + zero_points), ties to even, clamped to int8; the
    offset is added (modelslim: x_q = x / input_scale + input_offset)."""
    x = torch.tensor([[0.5, -1.0, 2.0, 0.25], [100.0, -100.0, 0.375, 0.0]], dtype=torch.float16)
    s = torch.full((4,), 10.0, dtype=torch.float16)
    zp = torch.full((4,), 3.0, dtype=torch.float16)
    y = tnpu.npu_quantize(x, s, zp, torch.qint8, -1, False)
    assert y.dtype == torch.int8
    assert y.tolist() == [[8, -7, 23, 6], [127, -128, 7, 3]]  # 5.5 -> 6 (even)
    y0 = tnpu.npu_quantize(x, s, None, torch.qint8, -1, False)
    assert y0[0].tolist() == [5, -10, 20, 2]  # 2.5 rounds to the even 2
    with pytest.raises(ValueError, match="dtype"):
        tnpu.npu_quantize(x, s.float(), None, torch.qint8, -1, False)
    with pytest.raises(ValueError, match="zero_points"):
        tnpu.npu_quantize(x, s, zp[:1], torch.qint8, -1, False)
    with pytest.raises(NotImplementedError):
        tnpu.npu_quantize(x, s, zp, torch.qint8, -1, True)


def test_weight_quant_batchmatmul(tnpu):
    x = torch.randn(2, 3, dtype=torch.float16)
    w = torch.randint(-100, 100, (3, 4), dtype=torch.int8)  # [K, N]
    s = (torch.rand(4) / 50).half()
    out = tnpu.npu_weight_quant_batchmatmul(x, w, s)
    torch.testing.assert_close(out.float(), x.float() @ (w.float() * s.float()), atol=2e-2,
                               rtol=1e-2)
    with pytest.raises(ValueError, match="antiquant_scale"):
        tnpu.npu_weight_quant_batchmatmul(x, w, s.float())
    off = torch.full((4,), 2.0, dtype=torch.float16)  # added to the weight, then scaled
    out_o = tnpu.npu_weight_quant_batchmatmul(x, w, s, off)
    torch.testing.assert_close(out_o.float(), x.float() @ ((w.float() + 2.0) * s.float()),
                               atol=2e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="antiquant_offset"):
        tnpu.npu_weight_quant_batchmatmul(x, w, s, off.float())


def test_init_routing_v2_gather_index_counts_and_range(tnpu):
    x = torch.arange(3 * 2, dtype=torch.float32).view(3, 2)
    ids = torch.tensor([[2, 0], [0, 1], [2, 2]], dtype=torch.int32)  # pair p = row * K + k
    xs, row_idx, counts, _ = tnpu.npu_moe_init_routing_v2(
        x, ids, active_num=6, expert_num=3, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, 3], quant_mode=-1)
    # sorted by expert (stable): pairs 1 (e0), 2 (e0), 3 (e1), 0 (e2), 4 (e2), 5 (e2)
    assert row_idx.tolist() == [3, 0, 1, 2, 4, 5]  # where each pair landed
    assert torch.equal(xs, x[[0, 1, 1, 0, 2, 2]])
    assert counts.tolist() == [2, 1, 3] and counts.dtype == torch.int64
    _, _, cum, _ = tnpu.npu_moe_init_routing_v2(
        x, ids, active_num=6, expert_num=3, expert_tokens_num_type=0,
        expert_tokens_num_flag=True, active_expert_range=[0, 3], quant_mode=-1)
    assert cum.tolist() == [2, 3, 6]
    xs2, idx2, cnt2, _ = tnpu.npu_moe_init_routing_v2(
        x, ids, active_num=6, expert_num=3, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[2, 3], quant_mode=-1)
    assert cnt2.tolist() == [3] and idx2.tolist() == [0, -1, -1, -1, 1, 2]
    assert torch.equal(xs2[:3], x[[0, 2, 2]])
    with pytest.raises(TypeError, match="expert_idx"):
        tnpu.npu_moe_init_routing_v2(x, ids.long(), expert_num=3, active_expert_range=[0, 3])


def test_grouped_matmul_group_list_types(tnpu):
    x = torch.randn(5, 3)
    w = torch.randn(2, 3, 4)  # [E, K, N]
    want = torch.cat([x[:2] @ w[0], x[2:5] @ w[1]])
    counts = tnpu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 3]), split_item=2,
                                     group_type=0, group_list_type=1)[0]
    cums = tnpu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 5]), split_item=2,
                                   group_type=0, group_list_type=0)[0]
    torch.testing.assert_close(counts, want)
    torch.testing.assert_close(cums, want)
    with pytest.raises(ValueError, match="non-decreasing"):  # counts read as cumulative
        tnpu.npu_grouped_matmul([x], [w], group_list=torch.tensor([3, 2]), split_item=2,
                                group_type=0, group_list_type=0)
    with pytest.raises(ValueError, match="weight"):  # [E, N, K] instead of [E, K, N]
        tnpu.npu_grouped_matmul([x], [w.transpose(1, 2)], group_list=torch.tensor([2, 3]),
                                split_item=2, group_type=0, group_list_type=1)


def test_finalize_routing_index_order(tnpu):
    rows = torch.arange(4, dtype=torch.float32)[:, None].repeat(1, 2)  # row r holds r
    scales = torch.tensor([[1.0, 10.0], [100.0, 1000.0]])
    idx = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    row_major = tnpu.npu_moe_finalize_routing(rows, None, None, None, scales, idx, None,
                                              drop_pad_mode=2)
    col_major = tnpu.npu_moe_finalize_routing(rows, None, None, None, scales, idx, None,
                                              drop_pad_mode=0)
    assert row_major[:, 0].tolist() == [0 * 1 + 1 * 10, 2 * 100 + 3 * 1000]  # idx = i*K + k
    assert col_major[:, 0].tolist() == [0 * 1 + 2 * 10, 1 * 100 + 3 * 1000]  # idx = i + k*N
    with pytest.raises(ValueError, match="scales"):
        tnpu.npu_moe_finalize_routing(rows, None, None, None, scales.half(), idx, None, 2)


def test_graph_replays_device_inputs_but_keeps_host_lengths_until_update(tnpu):
    buf = torch.zeros(2)
    g = torch.npu.NPUGraph()

    @torch.inference_mode()
    def step():
        return (buf * 2 + 1).sum()

    with torch.npu.graph(g, auto_dispatch_capture=True):
        out = step()
    buf.copy_(torch.tensor([1.0, 2.0]))
    g.replay()
    assert out.item() == 8.0  # (1*2+1) + (2*2+1): the new contents were read
    with pytest.raises(RuntimeError, match="host"):
        with torch.npu.graph(torch.npu.NPUGraph()):
            buf.sum().item()


def test_graph_update_changes_captured_lengths(tnpu):
    ks = [torch.randn(9, 1, 16, dtype=torch.float16)]
    kc, vc, table = _paged(ks, ks)
    q = torch.randn(1, 1, 32, dtype=torch.float16)
    args = dict(block_table=table[:, :1], block_size=128, num_heads=2, num_key_value_heads=1,
                scale=1.0, input_layout="BSH")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, auto_dispatch_capture=True):
        out, _ = tnpu.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths_kv=[4], **args)
    want4 = out.clone()
    want9, _ = tnpu.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths_kv=[9], **args)
    g.replay()
    torch.testing.assert_close(out, want4)  # still the captured length
    g.update(cpu_update_input=[{"actual_seq_lengths_kv": [9]}])
    g.replay()
    torch.testing.assert_close(out, want9)
    with pytest.raises(ValueError, match="entries"):
        g.update(cpu_update_input=[{}, {}])
    plain = torch.npu.NPUGraph()
    with torch.npu.graph(plain):
        pass
    with pytest.raises(RuntimeError, match="auto_dispatch_capture"):
        plain.update(cpu_update_input=[])


def test_gating_top_k_softmax_values_ids_row_order_and_finished(tnpu):
    """softmax then top k (no renormalisation), int32 expert ids, row_idx numbered column-major
    (j * N + i), finished rows get expert E."""
    x = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, 0.1, 0.2, 4.0], [2.0, 2.5, -1.0, 0.0]])
    y, ids, rows = tnpu.npu_moe_gating_top_k_softmax(x, None, k=2)
    p = torch.softmax(x, -1)
    assert ids.dtype == torch.int32 and ids.tolist() == [[1, 2], [3, 0], [1, 0]]
    torch.testing.assert_close(y, torch.stack([p[0, [1, 2]], p[1, [3, 0]], p[2, [1, 0]]]))
    assert y.sum(-1).lt(1).all()  # not renormalised
    assert rows.tolist() == [[0, 3], [1, 4], [2, 5]]
    _, fid, _ = tnpu.npu_moe_gating_top_k_softmax(x, torch.tensor([False, True, False]), k=2)
    assert fid[1].tolist() == [4, 4] and fid[0].tolist() == [1, 2]
    yh, _, _ = tnpu.npu_moe_gating_top_k_softmax(x.half(), None, k=1)
    assert yh.dtype == torch.float16
    with pytest.raises(ValueError, match="k must"):
        tnpu.npu_moe_gating_top_k_softmax(x, None, k=5)
