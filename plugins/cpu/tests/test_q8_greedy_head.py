"""The default model's greedy LM head (the C file's "greedy Q8_0 LM head"): an int8 screen on AMX
tiles with a rigorous error bound picks the columns that can hold a row's maximum, and only those
get the exact int16-activation logits, so the ids must be exactly ``argmax`` of the logits the
head GEMM computes (``kernels.fgemm`` on the same Q8_0 blocks), the first maximum on ties
included. Then the graph runner: greedy steps take the screen, with the same tokens as the
per-op path (``test_native_graph`` compares whole generations on the default model)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from infer_cpu import kernels
from infer_cpu.quant.packing import KIND_I16, quantize_q8_blocks

pytestmark = pytest.mark.skipif(not kernels.q8_screen_available(),
                                reason="no Q8_0 screen in this build (it needs AMX int8 tiles)")


def _head(w: torch.Tensor, tiles: bool = True):
    """The plugin's LM head for dense w [V, K]: Q8_0 blocks, int16 activations (packed tiles as
    the plugin packs them: the full head's 32-row steps sum on AMX tiles)."""
    qw = quantize_q8_blocks(w)
    qw = dataclasses.replace(qw, kind=qw.kind | KIND_I16)
    return kernels.with_tiles(qw) if tiles else qw


def _rows(b: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Rows like a final-normed residual stream's: a few channels far larger than the rest."""
    h = torch.randn(b, k, generator=gen)
    h[:, 3] *= 40
    h[:, k // 2 + 1] *= -15
    return h


def _want(h: torch.Tensor, qw) -> torch.Tensor:
    return kernels.fgemm(h, qw).argmax(-1)


@pytest.mark.parametrize("v,k", [(49152, 576), (1000, 64), (333, 128)])
@pytest.mark.parametrize("threads", [1, 2])
def test_screened_ids_are_argmax_of_the_logits(v, k, threads):
    gen = torch.Generator().manual_seed(v + k + threads)
    w = torch.randn(v, k, generator=gen) * 0.05
    w[:, 3] *= 0.2
    qw = _head(w)
    screen = kernels.Q8ScreenData(qw)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels.load().infer_set_threads(threads)
        for b in (1, 3, 8, 16, 17, 33):
            h = _rows(b, k, gen)
            assert torch.equal(kernels.q8_head_greedy(h, screen), _want(h, qw)), b
            assert screen.full_rows == 0
    finally:
        torch.set_num_threads(old)
        kernels.load().infer_set_threads(old)


def test_strided_rows_and_the_screen_needs():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(700, 128, generator=gen) * 0.05
    qw = _head(w)
    screen = kernels.Q8ScreenData(qw)
    big = _rows(6, 256, gen)
    h = big[:, :128]  # rows 256 floats apart
    assert torch.equal(kernels.q8_head_greedy(h, screen), _want(h.contiguous(), qw))
    assert kernels.q8_head_greedy(torch.randn(2, 64), screen) is None  # K differs: not taken
    with pytest.raises(ValueError, match="multiple of 64"):
        kernels.Q8ScreenData(_head(torch.randn(50, 96)))


def test_ties_take_the_first_column():
    """Equal columns give equal logits: argmax's first one, wherever it lies."""
    gen = torch.Generator().manual_seed(2)
    v, k = 4096, 128
    w = torch.randn(v, k, generator=gen) * 0.05
    h = _rows(16, k, gen)
    best = _want(h, _head(w))
    for i, n in enumerate(best.tolist()):  # copies of row i's best column, before and after it
        for c in (n - 700 * (i + 1), n + 5, n + 2000):
            if 0 <= c < v and c != n:
                w[c] = w[n]
    qw = _head(w)
    logits = kernels.fgemm(h, qw)
    assert (logits == logits.max(-1, keepdim=True).values).sum(-1).max() > 1  # ties exist
    assert torch.equal(kernels.q8_head_greedy(h, kernels.Q8ScreenData(qw)), logits.argmax(-1))


def _near_tied(b: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A head whose rows' best columns have copies 1e-4 apart per weight (below what the int8
    codes resolve), and the rows."""
    v, k = 49152, 576
    w = torch.randn(v, k, generator=gen) * 0.05
    h = _rows(b, k, gen)
    for i, n in enumerate(_want(h, _head(w)).tolist()):
        for d in range(1, 4):
            w[(n + 997 * d * (i + 1)) % v] = w[n] + torch.randn(k, generator=gen) * 1e-4
    return w, h


def test_near_ties_below_the_int8_resolution():
    w, h = _near_tied(8, torch.Generator().manual_seed(3))
    qw = _head(w)
    assert torch.equal(kernels.q8_head_greedy(h, kernels.Q8ScreenData(qw)), _want(h, qw))


def test_a_bound_without_its_terms_picks_wrong_columns():
    """The tests above can fail: with the bound's column terms zeroed (the approximation taken as
    exact), rows whose best column has near-tied copies come out wrong."""
    w, h = _near_tied(32, torch.Generator().manual_seed(4))
    qw = _head(w)
    screen = kernels.Q8ScreenData(qw)
    want = _want(h, qw)
    assert torch.equal(kernels.q8_head_greedy(h, screen), want)
    for t in (screen.err, screen.qnorm, screen.wnorm):
        t.zero_()
    assert not torch.equal(kernels.q8_head_greedy(h, screen), want)


def test_zero_and_non_finite_rows():
    """A zero row (every logit 0: a tie over the whole vocabulary, more candidates than a unit
    keeps: every logit) and rows with inf / nan (every logit, torch's argmax rule) among
    ordinary rows."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(20000, 64, generator=gen) * 0.05
    qw = _head(w)
    screen = kernels.Q8ScreenData(qw)
    h = _rows(6, 64, gen)
    h[1] = 0
    h[3, 5] = float("inf")
    h[4, 9] = float("nan")
    ids = kernels.q8_head_greedy(h, screen)
    assert screen.full_rows == 3
    assert torch.equal(ids, kernels.fgemm(h, qw).argmax(-1))


@pytest.mark.slow
def test_graph_greedy_steps_take_the_screen(greedy, monkeypatch):
    """The default model's greedy steps through the graph runner take the screen, with the tokens
    of the same engine with the screen off (INFER_CPU_GREEDY_SCREEN=0)."""
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.loader.default_model import ensure_default_model

    path = str(ensure_default_model(quiet=True))
    prompts = [list(range(200, 240)), list(range(300, 307)), list(range(500, 519))]
    counts = [12, 12, 7]
    calls = {"n": 0}
    screened = kernels.q8_head_greedy

    def counted(x, screen):
        calls["n"] += 1
        return screened(x, screen)

    monkeypatch.setattr(kernels, "q8_head_greedy", counted)
    on = EngineCore(ServerArgs(model_path=path, chunked_prefill_size=32))
    assert on.runner.graph_runner.q8_screen is not None
    got = greedy(on, prompts, counts)
    assert calls["n"] >= 12  # the prefill and decode steps' greedy rows
    del on
    monkeypatch.setenv("INFER_CPU_GREEDY_SCREEN", "0")
    off = EngineCore(ServerArgs(model_path=path, chunked_prefill_size=32))
    assert off.runner.graph_runner.q8_screen is None
    n = calls["n"]
    assert greedy(off, prompts, counts) == got
    assert calls["n"] == n
