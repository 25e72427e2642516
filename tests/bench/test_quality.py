"""The quality measure of ``infer bench quality``: windows of the pydoc_data text, the logits tap,
and perplexity / KL through the serving modes, checked against transformers on a tiny float32
Llama (the engine's float32 path is exact up to float rounding, so every mode must give the
transformers perplexity)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from infer.cli.bench_metrics import quality_metrics
from infer.cli.bench_quality import (
    LogitsTap,
    meets_bar,
    quality_windows,
    reference_logprobs,
    score_mode,
    text_windows,
)
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
from tiny import make_tiny_llama  # noqa: E402


def test_text_windows_are_spread_over_the_whole_text():
    ids = list(range(1000))
    wins = text_windows(ids, 4, 100)
    assert [w[0] for w in wins] == [0, 300, 600, 900] and all(len(w) == 100 for w in wins)
    assert text_windows(ids, 1, 1000) == [ids]
    with pytest.raises(ValueError, match="fewer than one window"):
        text_windows(ids[:50], 2, 100)
    with pytest.raises(ValueError):
        text_windows(ids, 0, 10)


def test_quality_metrics_and_bar():
    m = quality_metrics([1.0, 3.0], [0.0, 0.5], [True, False])
    assert m["tokens"] == 2 and m["perplexity"] == pytest.approx(math.exp(2.0))
    assert m["kl_mean"] == 0.25 and m["top1_agree"] == 0.5
    assert "kl_mean" not in quality_metrics([0.5])
    with pytest.raises(ValueError):
        quality_metrics([])
    assert meets_bar(10.09, 10.0) and not meets_bar(10.11, 10.0)
    assert not meets_bar(10.05, 10.0, peer_ppl=10.04) and meets_bar(10.04, 10.0, peer_ppl=10.04)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    d = tmp_path_factory.mktemp("tiny_llama")
    hf = make_tiny_llama(d).eval()
    core = EngineCore(ServerArgs(model_path=str(d), dtype="float32", max_total_tokens=8192))
    return d, hf, core


def _hf_logprobs(hf, windows: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(torch.tensor(windows)).logits.float()
    return torch.log_softmax(logits, -1)[:, :-1]  # [W, L - 1, V]


def test_every_mode_scores_every_position_against_transformers(tiny):
    _, hf, core = tiny
    wins = quality_windows(core.tokenizer, 3, 24)
    want = _hf_logprobs(hf, wins)
    tgt = torch.tensor([w[1:] for w in wins])
    hf_ppl = math.exp(-want.gather(2, tgt[..., None]).mean().item())
    ref = reference_logprobs(core, wins)
    torch.testing.assert_close(ref, want, rtol=1e-4, atol=1e-4)
    for mode in ("prefill", "extend", "decode"):
        r = score_mode(core, wins, mode, 5, ref)
        assert r["tokens"] == 3 * 23 and r["perplexity"] == pytest.approx(hf_ppl, rel=1e-4)
        assert r["kl_mean"] < 1e-6 and r["top1_agree"] > 0.95
        if mode == "prefill":
            assert r["requests"] == 3 and r["cached_tokens"] == 0
        else:  # request k of a window hits the prefix left by request k - 1
            e = 5 if mode == "extend" else 1
            n = -(-24 // e)
            assert r["requests"] == 3 * n
            assert r["cached_tokens"] == 3 * sum(min(k * e, 24) for k in range(n))


def test_tap_rows_are_the_engines_prompt_logprobs(tiny):
    _, _, core = tiny
    ids = quality_windows(core.tokenizer, 1, 20)[0]
    rows: dict[int, torch.Tensor] = {}
    tap = LogitsTap.on(core.runner)
    tap.sink = lambda rid, p0, lp: rows.update({p0 + j: lp[j] for j in range(lp.shape[0])})
    try:
        core.add_request(core.make_request("tap", ids, {"max_new_tokens": 1, "temperature": 0.0},
                                           return_logprob=True, logprob_start_len=3))
        outs = []
        while core.has_work():
            outs += core.step()
    finally:
        tap.sink = None
        core.flush_cache()
    reported = [lp for o in outs for _, lp in (o.prompt_logprobs or [])]
    reported = [lp for lp in reported if lp is not None]
    assert sorted(rows) == list(range(3, 20))
    mine = [rows[p][ids[p + 1]].item() for p in range(3, 19)]
    assert mine == pytest.approx(reported[-len(mine):], abs=1e-5)


def test_cli_refuses_a_bad_mode(tiny):
    from infer.cli.main import app

    d, _, _ = tiny
    res = CliRunner().invoke(app, ["bench", "quality", "--model-path", str(d), "--mode", "warm"])
    assert res.exit_code == 2 and "--mode warm" in res.output
