"""The bf16 stack's greedy LM head (the C file's "greedy LM head"): an int8 screen with a rigorous
error bound picks the columns that can hold a row's maximum, and only those are computed exactly,
so the ids must be exactly ``argmax`` of the logits the same library computes, first maximum on
ties included. The head alone is driven through ``infer_bf16_decode_layers`` with no layers (the
final norm and the head only), against the same call returning logits; then the engine, screen
on against screen off, and a batch whose rows need logits."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from infer_cpu.kernels import bf16 as kb

pytestmark = pytest.mark.skipif(kb.load() is None or not kb.load().infer_bf16_screen_ok(),
                                reason="no int8 screen in this build (it needs AVX-512 VNNI)")



def _head(h: torch.Tensor, w: kb.PackedBF16, screen: kb.ScreenData | None, threads: int = 2,
          ids: bool | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Logits [B, V] or greedy ids [B] (``ids``; by default, where a screen is given) of rows h
    [B, K] through the final norm (weight 1) and the head (of ``lib``, by default the plugin's)."""
    ids = screen is not None if ids is None else ids
    lib = lib or kb.load()
    b, k = h.shape
    v = w.out_features
    pos = torch.zeros(b, dtype=torch.int64)
    seq_lens = torch.ones(b, dtype=torch.int32)
    tables = torch.zeros(b, 1, dtype=torch.int32)
    norm = torch.ones(k)
    out = torch.empty(b, dtype=torch.int64) if ids else torch.empty(b, v)
    hh = h.clone()
    lib.infer_bf16_decode_layers(
        None, 0, hh.data_ptr(), b, k, 1, 1, k, 4 * k, 1e-6, pos.data_ptr(), None, 2,
        pos.data_ptr(), tables.data_ptr(), 1, seq_lens.data_ptr(), 1, 1.0, threads,
        norm.data_ptr(), 1e-6, w.data.data_ptr(), v,
        None if ids else out.data_ptr(),
        ctypes.byref(screen.struct) if screen is not None else None,
        out.data_ptr() if ids else None)
    return out


def _stats() -> list[int]:
    """(rows, exact candidates, rows on every logit, units computed whole) since the last read."""
    s = torch.zeros(4, dtype=torch.int64)
    kb.load().infer_bf16_screen_stats(s.data_ptr())
    return s.tolist()


def _rows(b: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Rows like a residual stream's: a few channels far larger than the rest."""
    h = torch.randn(b, k, generator=gen)
    h[:, 3] *= 40
    h[:, k // 2 + 1] *= -15
    return h


@pytest.mark.parametrize("v,k", [(49152, 576), (1000, 64), (333, 36)])
@pytest.mark.parametrize("threads", [1, 2])
def test_screened_ids_are_argmax_of_the_logits(v, k, threads):
    gen = torch.Generator().manual_seed(v + k + threads)
    w = torch.randn(v, k, generator=gen) * 0.05
    w[:, 3] *= 0.2  # the large channel's weights small: its products stay comparable
    packed, screen = kb.pack(w), kb.ScreenData(w)
    _stats()
    for b in (1, 3, 8, 32, 37):
        h = _rows(b, k, gen)
        ids = _head(h, packed, screen, threads)
        assert torch.equal(ids, _head(h, packed, None, threads).argmax(-1)), b
    rows, cands, full, _ = _stats()
    assert rows == 81 and full == 0
    assert cands > rows  # flat random logits: rows had several candidates, computed exactly


def test_ids_without_a_screen_take_every_logit():
    """ids asked for with no screen: every logit (the logits step's head), argmax's rule."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(1000, 64, generator=gen) * 0.05
    w[7] = w[900]  # a tie: the first column
    packed = kb.pack(w)
    h = _rows(5, 64, gen)
    _stats()
    assert torch.equal(_head(h, packed, None, ids=True), _head(h, packed, None).argmax(-1))
    assert _stats()[0] == 0  # not screened


def test_ties_take_the_first_column():
    """Equal columns give equal logits: argmax's first one, in whichever unit it lies."""
    gen = torch.Generator().manual_seed(1)
    v, k = 4096, 128
    w = torch.randn(v, k, generator=gen) * 0.05
    h = _rows(16, k, gen)
    best = _head(h, kb.pack(w), None).argmax(-1)
    for i, n in enumerate(best.tolist()):  # copies of row i's best column, before and after it
        for c in (n - 700 * (i + 1), n + 5, n + 2000):
            if 0 <= c < v and c != n:
                w[c] = w[n]
    packed = kb.pack(w)
    logits = _head(h, packed, None)
    assert (logits == logits.max(-1, keepdim=True).values).sum(-1).max() > 1  # ties exist
    assert torch.equal(_head(h, packed, kb.ScreenData(w)), logits.argmax(-1))


def test_near_ties_below_the_int8_resolution():
    """Columns that differ from the best one by less than the int8 codes can see: the screen
    cannot order them and must compute them exactly."""
    gen = torch.Generator().manual_seed(2)
    v, k = 2048, 256
    w = torch.randn(v, k, generator=gen) * 0.05
    h = _rows(8, k, gen)
    best = _head(h, kb.pack(w), None).argmax(-1).tolist()
    for i, n in enumerate(best):
        for d in range(1, 6):
            c = (n + 37 * d * (i + 1)) % v
            w[c] = w[n] + torch.randn(k, generator=gen) * 1e-4
    packed = kb.pack(w)
    _stats()
    assert torch.equal(_head(h, packed, kb.ScreenData(w)), _head(h, packed, None).argmax(-1))
    assert _stats()[1] >= 8 * 2  # each row's close columns went through the exact path


def test_zero_and_non_finite_rows():
    """A zero row (every logit 0: every column a candidate, the units computed whole) and rows
    with inf / nan (every logit, torch's argmax rule) among ordinary rows."""
    gen = torch.Generator().manual_seed(3)
    v, k = 20000, 64  # units of 640 columns: more than a unit keeps
    w = torch.randn(v, k, generator=gen) * 0.05
    h = _rows(6, k, gen)
    h[1] = 0
    h[3, 5] = float("inf")
    h[4, 9] = float("nan")
    packed = kb.pack(w)
    _stats()
    ids = _head(h, packed, kb.ScreenData(w))
    rows, _, full, units = _stats()
    assert rows == 6 and full >= 2 and units >= 1
    assert torch.equal(ids, _head(h, packed, None).argmax(-1))


@pytest.mark.parametrize("b", [8, 32])  # 8 and 16 pairs taken exactly
def test_a_bound_without_its_terms_picks_wrong_columns(b):
    """The tests above can fail: with the bound's column terms zeroed (the approximation taken
    as exact), rows whose best column has near-tied copies come out wrong."""
    gen = torch.Generator().manual_seed(4)
    v, k = 49152, 576
    w = torch.randn(v, k, generator=gen) * 0.05
    h = _rows(b, k, gen)
    for i, n in enumerate(_head(h, kb.pack(w), None).argmax(-1).tolist()):
        for d in range(1, 4):  # copies of row i's best column, 1e-4 apart per weight
            w[(n + 997 * d * (i + 1)) % v] = w[n] + torch.randn(k, generator=gen) * 1e-4
    packed, screen = kb.pack(w), kb.ScreenData(w)
    want = _head(h, packed, None).argmax(-1)
    assert torch.equal(_head(h, packed, screen), want)
    for t in (screen.err, screen.qnorm, screen.wnorm):
        t.zero_()
    assert not torch.equal(_head(h, packed, screen), want)


@pytest.fixture(scope="module")
def vdp_lib(avx512_lib) -> ctypes.CDLL:
    """This library built without AMX (its head sums with vdpbf16ps), where the plugin's own
    head sums on AMX tiles."""
    if kb.isa() != "amx_bf16":
        pytest.skip("the head does not sum on AMX tiles here")
    return avx512_lib


def _order_flip(k: int = 576) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A row and two head columns whose logits order one way as the AMX tiles sum them and the
    other way as vdpbf16ps does (found by a search over seeds and columns: a random column and
    copies of it with two weights moved by one bf16 step; seed 8, copy 3747; the test checks that
    the two libraries do order them apart)."""
    gen = torch.Generator().manual_seed(8)
    w0 = torch.randn(k, generator=gen) * 0.05
    moved = torch.randint(0, k, (4096, 2), generator=gen)[3747]
    w1 = w0.clone()
    for i in moved.tolist():
        w1[i] = w1[i] * (1 + 2 ** -7 * (1 if (3747 + i) % 2 else -1))
    h = torch.randn(1, k, generator=gen)
    h[:, 3] *= 40
    return h, w0, w1


def test_candidates_sum_as_the_full_head_does(vdp_lib):
    """On AMX the full head's logits are AMX tile sums, so the screen's exact candidates must be
    too: two near-equal columns that the tiles and vdpbf16ps order differently, among small ones,
    both candidates (the int8 codes cannot tell them apart); the screened id is the tiles' argmax."""
    h, a, b = _order_flip()
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(300, a.numel(), generator=gen) * 0.01
    w[40], w[170] = a, b
    packed = kb.pack(w)
    full = _head(h, packed, None)
    assert full.argmax(-1).tolist() == [170]  # the tiles: column 170 by a float32 step or two
    assert _head(h, packed, None, lib=vdp_lib).argmax(-1).tolist() == [40]  # vdpbf16ps: 40
    _stats()
    assert _head(h, packed, kb.ScreenData(w)).tolist() == [170]
    rows, cands, whole_rows, units = _stats()
    assert rows == 1 and cands >= 2 and whole_rows == 0 and units == 0  # the gathered candidates


def _core(path: Path):
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    return EngineCore(ServerArgs(model_path=str(path), dtype="bfloat16", page_size=4,
                                 max_total_tokens=1024))


def test_engine_greedy_steps_match_with_and_without_the_screen(tiny_bf16, greedy):
    """A tiny bf16 model: the same greedy tokens with the screen as without it (every step's
    logits and argmax), and the screen ran on its decode and prefill rows."""
    prompts = [list(range(5, 12)), list(range(40, 61)), list(range(100, 103))]
    outs = []
    for on in (True, False):
        core = _core(tiny_bf16)
        stack = core.runner.graph_runner._bf16
        assert stack.screen is not None
        if not on:
            stack.screen = None
        _stats()
        outs.append(greedy(core, prompts, 20))
        rows = _stats()[0]
        assert (rows >= 3 * 20) if on else rows == 0
    assert outs[0] == outs[1]


def test_rows_that_need_logits_get_them(tiny_bf16, greedy):
    """One request asking for logprobs in the batch: the step computes logits (no screen) and
    the greedy request's tokens are those it gets alone."""
    core = _core(tiny_bf16)
    alone = greedy(core, [list(range(5, 12))], 12)[0]
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    core.add_request(core.make_request("a", list(range(5, 12)), params))
    core.add_request(core.make_request("b", list(range(40, 50)), params, return_logprob=True))
    toks, lps = {}, {}
    _stats()
    while core.has_work():
        for o in core.step():
            toks.setdefault(o.rid, []).extend(o.new_token_ids)
            lps.setdefault(o.rid, []).extend(o.output_logprobs)
    assert _stats()[0] == 0  # every step had the logprobs row: logits, no screen
    assert toks["a"] == alone
    assert len(lps["b"]) == 12 and all(lp <= 0 for lp in lps["b"])
