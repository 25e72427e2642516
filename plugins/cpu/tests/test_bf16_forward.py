"""The bf16 stack over extend rows (``infer_bf16_forward_layers``: prefill, extend over a cached
prefix and decode rows in one batch, every layer, the final norm and the LM head on chosen rows)
against a plain-torch forward with the same rounding points: GEMM inputs, the KV cache and, for
sequences of several rows, the queries and the attention's probabilities in bf16 (one-row
sequences take the decode attention in float32); the residual stream and sums in float32. Random
layers with GQA, qkv bias, partial rotary and odd sizes; shuffled pages of 4 tokens."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch
from infer.core.model.layers.rotary import rope_table
from infer.core.ops.layer_ops import rms_norm_ref
from infer_cpu.kernels import bf16 as kb

_spec = importlib.util.spec_from_file_location("bf16_decode_cases", Path(__file__).with_name("test_bf16_decode.py"))
_dec = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _dec  # dataclasses look their module up
_spec.loader.exec_module(_dec)  # the decode stack's test: its layer dims and random layers
CASES, Dims, _bf, _layer = _dec.CASES, _dec.Dims, _dec._bf, _dec._layer
_reference = _dec._reference_forward

pytestmark = pytest.mark.skipif(kb.load() is None, reason=f"bf16 kernels unavailable: {kb.detail()}")

PAGE = 4


def _check(d: Dims, seqs: list[tuple[int, int]], threads: int, seed: int, logit_rows=None) -> None:
    g = torch.Generator().manual_seed(seed)
    n_layers, eps = 2, 1e-5
    pages = list(range(1, 200))
    random.Random(seed).shuffle(pages)
    tables = [[pages.pop() for _ in range((p + e + PAGE - 1) // PAGE)] for p, e in seqs]
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    pos = torch.cat([torch.arange(p, p + e) for p, e in seqs]).long()
    slots = torch.tensor([t[i // PAGE] * PAGE + i % PAGE
                          for (p, e), t in zip(seqs, tables, strict=True) for i in range(p, p + e)],
                         dtype=torch.int64)
    seq_lens = torch.tensor([p + e for p, e in seqs], dtype=torch.int32)
    ext = torch.tensor([e for _, e in seqs], dtype=torch.int32)
    cos_sin = rope_table(d.rot, 256, {"rope_theta": 10000.0})
    shape = (200, PAGE, d.kv_heads, d.head_dim)
    kcs = [torch.randn(shape, generator=g).bfloat16() for _ in range(n_layers)]  # the prefixes
    vcs = [torch.randn(shape, generator=g).bfloat16() for _ in range(n_layers)]
    layers = [_layer(d, g) for _ in range(n_layers)]
    t = int(ext.sum())
    h0 = torch.randn(t, d.hidden, generator=g)
    scale = d.head_dim ** -0.5 * 1.3  # not the default: a kernel ignoring it fails
    ref_k, ref_v = [c.clone() for c in kcs], [c.clone() for c in vcs]
    want = _reference(d, layers, h0.clone(), seqs, tables, PAGE, cos_sin, ref_k, ref_v, eps, scale)

    packed = [{n: kb.pack(lw[n]) for n in ("wqkv", "wo", "wgu", "wdown")} for lw in layers]
    table = (kb.Layer * n_layers)()
    for i, (lw, pk) in enumerate(zip(layers, packed, strict=True)):
        table[i] = kb.Layer(lw["in_norm"].data_ptr(), lw["post_norm"].data_ptr(),
                            *(pk[n].data.data_ptr() for n in ("wqkv", "wo", "wgu", "wdown")),
                            lw["bqkv"].data_ptr() if lw["bqkv"] is not None else None,
                            kcs[i].data_ptr(), vcs[i].data_ptr())
    vocab, final_eps = 77, 0.25
    final_norm = 1 + 0.1 * torch.randn(d.hidden, generator=g)
    lm = (torch.randn(vocab, d.hidden, generator=g) * d.hidden ** -0.5).bfloat16()
    rows = torch.tensor(logit_rows if logit_rows is not None else
                        [int(x) - 1 for x in ext.cumsum(0)], dtype=torch.int64)
    want_logits = _bf(rms_norm_ref(want[rows], final_norm, final_eps)[0]) @ lm.float().t()
    h, logits = h0.clone(), torch.full((len(rows), vocab), float("nan"))
    lm_packed = kb.pack(lm)
    kb.load().infer_bf16_forward_layers(
        table, n_layers, h.data_ptr(), t, d.hidden, d.heads, d.kv_heads, d.head_dim, d.inter, eps,
        pos.data_ptr(), cos_sin.data_ptr(), d.rot, slots.data_ptr(), bt.data_ptr(), bt.stride(0),
        seq_lens.data_ptr(), ext.data_ptr(), len(seqs), PAGE, scale, threads,
        final_norm.data_ptr(), final_eps, lm_packed.data.data_ptr(), vocab, rows.data_ptr(),
        len(rows), logits.data_ptr(), None, None)
    # the same rounding points; float32 sums in another order flip a bf16 rounding now and then
    # by an ulp, and a flipped key or value in the cache moves every later row of its sequence by
    # ~1e-3 (so no count of exact rows is asked for here, unlike the decode stack's test); a
    # wrong row, head, mask, position or scale moves rows by O(1e-1) or more
    err = (h - want).norm(dim=1) / (want - h0).norm(dim=1)
    assert err.max() < 5e-3 and err.median() < 2e-3, f"per-row errors {err}"
    err = (logits - want_logits).norm(dim=1) / want_logits.norm(dim=1)
    assert err.max() < 2e-2, f"logits {err}"
    for mine, ref in zip(kcs + vcs, ref_k + ref_v, strict=True):
        off = (mine.float() - ref.float()).abs() > 1e-3 + 2 ** -7 * ref.float().abs()
        assert off.float().mean() < 1e-3 and (mine.float() - ref.float()).abs().max() < 0.02


SEQS = {
    "prefill": [(0, 7), (0, 33), (0, 1)],  # the 32-row query blocks and their tails
    "extend_over_prefix": [(9, 5), (30, 40), (3, 1)],
    "mixed_with_decode_rows": [(17, 1), (0, 12), (5, 1), (8, 2), (40, 3)],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seqs", list(SEQS))
@pytest.mark.parametrize("threads", [1, 2])
def test_forward_layers_against_torch(case, seqs, threads):
    _check(CASES[case], SEQS[seqs], threads, seed=len(case) * 7 + len(seqs) + threads)


def test_many_rows_and_chosen_logit_rows():
    """More than 64 rows (the row norms become a pool job), logits of rows not at the end."""
    seqs = [(0, 70), (12, 30)]
    _check(CASES["smollm2_like"], seqs, 2, seed=5, logit_rows=[0, 69, 3, 99, 70])
