"""The bf16 decode stack (``infer_bf16_decode_layers``) against a plain-torch step with the same
rounding points (GEMM inputs and the KV cache in bf16, everything else float32), on random
layers: GQA groups, qkv bias, partial rotary, odd sizes, paged caches with shuffled pages and
sequences of different lengths."""

from __future__ import annotations

import ctypes
import platform
import random
import subprocess
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from infer.core.model.layers.rotary import rope_table
from infer.core.ops.layer_ops import rms_norm_ref, rotary_ref
from infer_cpu.kernels import bf16 as kb
from infer_cpu.native_build import BF16_SOURCE, compiler

pytestmark = pytest.mark.skipif(kb.load() is None, reason=f"bf16 kernels unavailable: {kb.detail()}")


@dataclass
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    rot: int
    bias: bool


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def _layer(d: Dims, g: torch.Generator) -> dict[str, torch.Tensor | None]:
    qkv_w = (d.heads + 2 * d.kv_heads) * d.head_dim
    scale = d.hidden ** -0.5

    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=g) * k ** -0.5).bfloat16()

    return {"in_norm": 1 + 0.1 * torch.randn(d.hidden, generator=g),
            "post_norm": 1 + 0.1 * torch.randn(d.hidden, generator=g),
            "wqkv": w(qkv_w, d.hidden), "wo": w(d.hidden, d.heads * d.head_dim),
            "wgu": w(2 * d.inter, d.hidden), "wdown": w(d.hidden, d.inter),
            "bqkv": torch.randn(qkv_w, generator=g) * scale if d.bias else None}


def _reference_forward(d: Dims, layers, h, seqs, tables, page, cos_sin, kcs, vcs, eps,
                       scale) -> torch.Tensor:
    """h [T, hidden] float32 of the packed rows -> h after every layer (caches updated).
    seqs: (prefix, ext) per sequence; its rows sit at positions prefix .. prefix + ext - 1."""
    hd, g = d.heads * d.head_dim, d.heads // d.kv_heads
    pos = torch.cat([torch.arange(p, p + e) for p, e in seqs])
    slots = torch.tensor([t[i // page] * page + i % page
                          for (p, e), t in zip(seqs, tables, strict=True) for i in range(p, p + e)])
    for lw, kc, vc in zip(layers, kcs, vcs, strict=True):
        x = _bf(rms_norm_ref(h, lw["in_norm"], eps)[0])
        qkv = x @ lw["wqkv"].float().t() + (lw["bqkv"] if lw["bqkv"] is not None else 0)
        t = h.shape[0]
        q = qkv[:, :hd].reshape(t, d.heads, d.head_dim)
        k = qkv[:, hd:hd + d.kv_heads * d.head_dim].reshape(t, d.kv_heads, d.head_dim)
        v = qkv[:, hd + d.kv_heads * d.head_dim:].reshape(t, d.kv_heads, d.head_dim)
        q, k = rotary_ref(pos, q, k, cos_sin, d.rot)
        kflat, vflat = kc.view(-1, d.kv_heads, d.head_dim), vc.view(-1, d.kv_heads, d.head_dim)
        kflat[slots] = k.bfloat16()
        vflat[slots] = v.bfloat16()
        qf, q = q.double(), _bf(q).double()  # one-row sequences keep float32 queries (below)
        outs, row = [], 0
        for (p, e), tbl in zip(seqs, tables, strict=True):
            n = p + e
            idx = torch.tensor([tbl[j // page] * page + j % page for j in range(n)])
            keys = kflat[idx].double().repeat_interleave(g, dim=1).transpose(0, 1)  # [H, n, D]
            vals = vflat[idx].double().repeat_interleave(g, dim=1).transpose(0, 1)
            for r in range(e):
                seen = p + r + 1
                # a sequence of one row (a decode row) takes the decode attention: float32 query
                # and probabilities; longer ones the prefill attention: bf16 query, probabilities
                # rounded to bf16 before P.V
                qr = qf[row + r] if e == 1 else q[row + r]
                s = (qr[:, None, :] @ keys[:, :seen].transpose(1, 2))[:, 0] * scale
                ex = torch.exp(s - s.max(-1, keepdim=True).values)  # [H, seen]
                pv = ex if e == 1 else _bf(ex.float()).double()
                o = (pv[:, None, :] @ vals[:, :seen])[:, 0] / ex.sum(-1, keepdim=True)
                outs.append(o.reshape(hd).float())
            row += e
        a = _bf(torch.stack(outs))
        h = h + a @ lw["wo"].float().t()
        x = _bf(rms_norm_ref(h, lw["post_norm"], eps)[0])
        gu = x @ lw["wgu"].float().t()
        a = _bf(F.silu(gu[:, :d.inter]) * gu[:, d.inter:])
        h = h + a @ lw["wdown"].float().t()
    return h



def _reference_step(d: Dims, layers, h, bt, seq_lens, page, cos_sin, kcs, vcs, eps,
                    scale) -> torch.Tensor:
    """One decode step in torch: h [B, hidden] float32 -> h after every layer (caches updated):
    the forward's one-row sequences."""
    tables = [bt[i, :(n + page - 1) // page].tolist() for i, n in enumerate(seq_lens)]
    return _reference_forward(d, layers, h, [(n - 1, 1) for n in seq_lens], tables, page, cos_sin,
                              kcs, vcs, eps, scale)


CASES = {
    "smollm2_like": Dims(hidden=96, heads=6, kv_heads=2, head_dim=64, inter=160, rot=64, bias=False),
    "odd_sizes_bias_mha": Dims(hidden=41, heads=3, kv_heads=3, head_dim=18, inter=37, rot=18,
                               bias=True),
    "partial_rotary": Dims(hidden=64, heads=4, kv_heads=1, head_dim=32, inter=48, rot=16,
                           bias=False),
}


def _avx2_build(tmp_path_factory, name: str, *defines: str) -> ctypes.CDLL:
    cc = compiler()
    if cc is None or platform.machine() != "x86_64" or "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("needs a C compiler and an x86-64 CPU with AVX2")
    out = tmp_path_factory.mktemp(name) / f"lib{name}.so"
    subprocess.run([cc, "-O3", "-mavx2", "-mfma", "-fopenmp", *defines, "-shared", "-fPIC", "-o",
                    str(out), str(BF16_SOURCE), "-lm"], check=True, capture_output=True)
    lib = kb.bind(ctypes.CDLL(str(out)))
    assert lib.infer_bf16_isa() == 2
    return lib


@pytest.fixture(scope="module")
def avx2_lib(tmp_path_factory) -> ctypes.CDLL:
    """The library built for AVX2 + FMA only (float32 activations in the GEMM)."""
    return _avx2_build(tmp_path_factory, "avx2")


@pytest.fixture(scope="module")
def avx2_per_head_lib(tmp_path_factory) -> ctypes.CDLL:
    """The AVX2 build whose decode attention runs in phase A, one KV head per unit (as before the
    all-heads phase, which the default build takes at every batch size)."""
    return _avx2_build(tmp_path_factory, "avx2_per_head", "-DATTN_APART_ROWS=1000000")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_decode_stack_against_torch_step(case, threads):
    _check_stack(CASES[case], threads, kb.lib_for_call(), seed=len(case) + threads)


@pytest.mark.parametrize("case", ["smollm2_like", "odd_sizes_bias_mha"])
def test_decode_stack_avx2_build(avx2_lib, case):
    _check_stack(CASES[case], 2, avx2_lib, seed=7)


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_stack_splits_the_odd_column_group_by_rows(threads):
    """A hidden of 9 column blocks (3 groups of the o and down projections on 2 threads): the
    third group runs as two units of rows (12 and 7 of 19), the others whole; against torch."""
    d = Dims(hidden=144, heads=6, kv_heads=2, head_dim=64, inter=160, rot=64, bias=False)
    _check_stack(d, threads, kb.lib_for_call(), seed=11,
                 seq_lens=[1 + (5 * i) % 17 for i in range(19)], num_pages=140)


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_stack_many_rows(threads):
    """19 sequences: the attention phase's units take 8 rows each (a partial last chunk)."""
    _check_stack(CASES["smollm2_like"], threads, kb.lib_for_call(), seed=3,
                 seq_lens=[1 + (7 * i) % 23 for i in range(19)], num_pages=140)


def test_decode_attention_of_all_heads_gives_the_per_head_bits(avx2_lib, avx2_per_head_lib):
    """The AVX2 decode attends each row over all its KV heads in one call (a phase of its own);
    the hidden states, logits and caches are the bits of one call per KV head."""
    lens = [1 + (7 * i) % 23 for i in range(19)]
    got = [_check_stack(CASES["smollm2_like"], 2, lib, seed=3, seq_lens=lens, num_pages=140)
           for lib in (avx2_lib, avx2_per_head_lib)]
    for a, b in zip(*got, strict=True):
        assert torch.equal(a, b)


def _check_stack(d: Dims, threads: int, lib: ctypes.CDLL, seed: int,
                 seq_lens: list[int] | None = None,
                 num_pages: int = 40) -> tuple[torch.Tensor, ...]:
    """One decode step of ``lib``'s stack against the torch step; its hidden states, logits and
    caches."""
    g = torch.Generator().manual_seed(seed)
    n_layers, page, eps = 2, 4, 1e-5
    # including the new token: page-aligned and not
    seq_lens = seq_lens or [1, 5, 9, 16, 23]
    b = len(seq_lens)
    pages = list(range(1, num_pages))
    random.Random(threads).shuffle(pages)
    tables = [[pages.pop() for _ in range((n + page - 1) // page)] for n in seq_lens]
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    pos = torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64)
    slots = torch.tensor([t[(n - 1) // page] * page + (n - 1) % page
                          for t, n in zip(tables, seq_lens, strict=True)], dtype=torch.int64)
    cos_sin = rope_table(d.rot, 64, {"rope_theta": 10000.0})
    shape = (num_pages, page, d.kv_heads, d.head_dim)
    kcs = [torch.randn(shape, generator=g).bfloat16() for _ in range(n_layers)]  # the prefixes
    vcs = [torch.randn(shape, generator=g).bfloat16() for _ in range(n_layers)]
    layers = [_layer(d, g) for _ in range(n_layers)]
    h0 = torch.randn(b, d.hidden, generator=g)
    scale = d.head_dim ** -0.5
    ref_k, ref_v = [c.clone() for c in kcs], [c.clone() for c in vcs]
    want = _reference_step(d, layers, h0.clone(), bt, seq_lens, page, cos_sin, ref_k, ref_v, eps,
                           scale)

    packed = [{name: kb.pack(lw[name]) for name in ("wqkv", "wo", "wgu", "wdown")} for lw in layers]
    table = (kb.Layer * n_layers)()
    for i, (lw, pk) in enumerate(zip(layers, packed, strict=True)):
        table[i] = kb.Layer(lw["in_norm"].data_ptr(), lw["post_norm"].data_ptr(),
                            *(pk[n].data.data_ptr() for n in ("wqkv", "wo", "wgu", "wdown")),
                            lw["bqkv"].data_ptr() if lw["bqkv"] is not None else None,
                            kcs[i].data_ptr(), vcs[i].data_ptr())
    # the final norm and LM head in the same call: an odd vocabulary (a 16-column block tail)
    vocab, final_eps = 77, 0.25  # large enough that using the layers' eps shows
    final_norm = 1 + 0.1 * torch.randn(d.hidden, generator=g)
    lm = (torch.randn(vocab, d.hidden, generator=g) * d.hidden ** -0.5).bfloat16()
    want_logits = _bf(rms_norm_ref(want, final_norm, final_eps)[0]) @ lm.float().t()
    h, lens = h0.clone(), torch.tensor(seq_lens, dtype=torch.int32)
    logits, lm_packed = torch.full((b, vocab), float("nan")), kb.pack(lm)
    lib.infer_bf16_decode_layers(
        table, n_layers, h.data_ptr(), b, d.hidden, d.heads, d.kv_heads, d.head_dim, d.inter,
        eps, pos.data_ptr(), cos_sin.data_ptr(), d.rot, slots.data_ptr(), bt.data_ptr(),
        bt.stride(0), lens.data_ptr(), page, scale, threads, final_norm.data_ptr(), final_eps,
        lm_packed.data.data_ptr(), vocab, logits.data_ptr(), None, None)
    # the same rounding points: only float32 summation order differs, and through it, now and
    # then, one bf16 rounding of a GEMM input flips by an ulp, which moves that row's later
    # values by ~1e-3 (seen in 1 row of 19, and in 1 of 5 with the vectorized exp of SiLU and
    # softmax, a few ulps from torch's); a wrong head, row or column moves many rows by O(1)
    flips = max(1, b // 8)
    rows = (h - want).norm(dim=1) / (want - h0).norm(dim=1)
    assert int((rows >= 2e-4).sum()) <= flips and rows.max() < 5e-3, f"per-row errors {rows}"
    rows = (logits - want_logits).norm(dim=1) / want_logits.norm(dim=1)
    assert int((rows >= 2e-3).sum()) <= flips and rows.max() < 2e-2, f"logits' errors {rows}"
    for mine, ref in zip(kcs + vcs, ref_k + ref_v, strict=True):
        off = (mine.float() - ref.float()).abs() > 1e-3 + 2 ** -7 * ref.float().abs()
        assert off.float().mean() < 1e-3 and (mine.float() - ref.float()).abs().max() < 0.02
    return (h, logits, *kcs, *vcs)


def _run_steps(tc: kb.ThreadChoice, batch: int, cost: dict[int, float], steps: int) -> list[int]:
    """``steps`` steps of a batch size, each taking ``cost[threads]``; the thread counts picked."""
    seen = []
    for _ in range(steps):
        t = tc.pick(batch)
        seen.append(t)
        tc.record(batch, t, cost[t])
    return seen


def test_thread_choice_measures_both_then_keeps_the_faster_and_explores():
    tc = kb.ThreadChoice(2, explore=4)
    # one thread faster (a loaded machine), the other close
    seen = _run_steps(tc, 8, {1: 0.010, 2: 0.013}, 12)
    assert seen[:2] == [1, 2]  # each size measured once
    # the faster; the other (1.3x) every 4 x 4 x 0.3 = 4.8 -> 5th step
    assert seen[2:] == [1, 1, 1, 1, 2, 1, 1, 1, 1, 2]
    _run_steps(tc, 8, {1: 0.010, 2: 0.001}, 4)  # the load went away: one exploring step finds it
    assert tc.pick(8) == 2
    assert tc.pick(1) == 1  # batch-size classes are measured separately
    tc.record(1, 1, 0.5)
    assert tc.pick(1) == 2


def test_thread_choice_max_first_tries_the_other_only_after_explore_steps():
    """A prefill class (``max_first``): all threads first, and one thread only after ``explore``
    more steps of the class, so that a server's second prompt of a size is not run on one thread
    (twice the time to first token); then the usual choice, class by class."""
    tc = kb.ThreadChoice(2, explore=4, max_first=True)
    seen = _run_steps(tc, 128, {1: 0.030, 2: 0.010}, 8)
    assert seen[:6] == [2, 2, 2, 2, 2, 1]  # measured: 2, then 4 steps, then the other once
    assert seen[6:] == [2, 2] and set(tc._avg) == {(8, 1), (8, 2)}
    assert tc.pick(512) == 2  # another class starts over
    tc.record(512, 2, 0.04)
    assert tc.pick(512) == 2
    # one thread faster (a loaded machine): found when it is tried
    picks = _run_steps(kb.ThreadChoice(2, explore=4, max_first=True), 64, {1: 0.005, 2: 0.010}, 8)
    assert picks == [2, 2, 2, 2, 2, 1, 1, 1]


def test_thread_choice_keeps_its_best_unless_the_other_is_clearly_faster():
    """One exploring step that came out a little quicker than the best's average (noise) does
    not move the class: the other must be below ``switch`` (0.9) times the best's average."""
    tc = kb.ThreadChoice(2, explore=4)
    for t, cost in ((1, 0.050), (2, 0.040)):  # both measured: two threads the faster
        assert tc.pick(32) == t
        tc.record(32, t, cost)
    seen = []
    for _ in range(4):  # one thread's exploring step at 0.038: 5 % quicker, kept at two
        t = tc.pick(32)
        seen.append(t)
        tc.record(32, t, 0.038 if t == 1 else 0.040)
    assert seen == [2, 2, 2, 1]  # a single look (every 4th: 4 x 4 x 0.25)
    assert tc.pick(32) == 2
    tc.record(32, 2, 0.040)
    # two threads keep their pace: one thread (at best 0.038) cannot win, so no more looks
    assert [tc.pick(32) for _ in range(40)] == [2] * 40
    while (t := tc.pick(32)) != 1:  # two threads slow down (a load): looks resume ...
        tc.record(32, t, 0.060)
    tc.record(32, 1, 0.030)  # ... and the clearly faster one thread takes over
    assert [tc.pick(32) for _ in range(2)] == [1, 1]


def test_thread_choice_on_more_threads_explores_only_while_the_other_could_win():
    """A class on all threads explores one thread only for its first ``looks`` steps, then only
    while one thread's fastest step is below ``switch`` times the best's average: on a steady
    machine a prefill class never runs a prompt on one thread again (each such prompt's time to
    first token was almost twice the usual)."""
    tc = kb.ThreadChoice(2, explore=4, max_first=True)
    seen = _run_steps(tc, 128, {1: 0.073, 2: 0.040}, 400)
    ones = [i for i, t in enumerate(seen) if t == 1]
    # measured after explore (4) steps, looked at once more (every round(16 x 0.825) = 13)
    assert ones == [5, 18], ones
    # a load: two threads now slower than one thread's 0.073
    last = _run_steps(tc, 128, {1: 0.073, 2: 0.090}, 30)[-12:]
    # the average crossed 0.073 / 0.9: a look, and one thread won; on one thread the class
    # looks at two threads again every round(16 x (0.090 / 0.073 - 1)) = 4th step
    assert last in [([1, 1, 1, 2] * 4)[i:i + 12] for i in range(4)], last


def test_thread_choice_explores_a_far_slower_candidate_less_often():
    """Each exploring step costs the other candidate's extra time (ratio - 1 steps), so it comes
    every 4 x ``explore`` x (ratio - 1) steps: about 1 / (4 x ``explore``) of the time, within
    [``explore``, 16 x ``explore``] steps. (A class on one thread, whose exploring goes on.)"""
    for ratio, every in ((1.1, 4), (2.0, 16), (3.5, 40), (9.0, 64)):
        seen = _run_steps(kb.ThreadChoice(2, explore=4), 32, {1: 0.010, 2: 0.010 * ratio}, 2 + 3 * every)
        explored = [i for i, t in enumerate(seen) if i >= 2 and t == 2]
        assert explored == [1 + every, 1 + 2 * every, 1 + 3 * every], (ratio, explored)


def test_thread_choice_fixed_and_single_thread():
    assert kb.ThreadChoice(1).pick(5) == 1 and kb.ThreadChoice(2, fixed=2).pick(1) == 2
