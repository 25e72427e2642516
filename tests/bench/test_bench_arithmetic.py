"""The arithmetic of ``infer bench`` (percentiles, throughputs, ITL, lengths), not its timings."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from infer.cli.bench_data import BenchRequest, sample_lengths
from infer.cli.bench_metrics import (
    RequestRecord,
    Summary,
    inter_token_latencies,
    offline_metrics,
    one_batch_metrics,
    percentile,
    serving_metrics,
)
from infer.cli.bench_serving import arrival_gaps, run_serving


def test_percentile_hand_values():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy_linear(xs, q):
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-6)


def test_summary_in_milliseconds():
    s = Summary.of([0.1, 0.2, 0.3])
    assert s.mean_ms == pytest.approx(200) and s.median_ms == pytest.approx(200)
    assert s.min_ms == pytest.approx(100) and s.max_ms == pytest.approx(300)
    assert s.p99_ms == pytest.approx(298)


def test_itl_from_timestamps():
    assert inter_token_latencies([1.0, 1.5, 1.75, 2.75]) == [0.5, 0.25, 1.0]
    assert inter_token_latencies([3.0]) == []


def _rec(start, chunks, end, n_in, n_out):
    return RequestRecord(start=start, chunk_times=chunks, end=end, input_tokens=n_in,
                         output_tokens=n_out, ok=True)


def test_serving_metrics_two_requests():
    a = _rec(0.0, [0.5, 0.6, 0.8], 0.8, 10, 3)  # ttft .5, e2e .8, tpot (.8-.5)/2 = .15
    b = _rec(1.0, [1.2, 1.6], 2.0, 20, 5)  # ttft .2, e2e 1.0, tpot (2.0-1.2)/4 = .2
    bad = RequestRecord(start=0.0, error="HTTP 400: nope")
    m = serving_metrics([a, b, bad], duration=2.0)
    assert m["completed"] == 2 and m["failed"] == 1 and m["errors"] == ["HTTP 400: nope"]
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 8
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(4.0)
    assert m["total_token_throughput"] == pytest.approx(19.0)
    assert m["ttft"]["mean_ms"] == pytest.approx(350)
    assert m["e2e"]["median_ms"] == pytest.approx(900)
    assert m["tpot"]["mean_ms"] == pytest.approx(175)
    # ITL gaps: .1, .2 from a; .4 from b
    assert m["itl"]["median_ms"] == pytest.approx(200)
    assert m["itl"]["mean_ms"] == pytest.approx(700 / 3)
    assert m["concurrency"] == pytest.approx(0.9)


def test_one_batch_and_offline_metrics():
    m = one_batch_metrics(4, 128, 3, prefill_s=0.5, decode_step_s=[0.1, 0.3])
    assert m["prefill_throughput"] == pytest.approx(4 * 128 / 0.5)
    assert m["decode_throughput"] == pytest.approx(8 / 0.4)
    assert m["decode_latency_median_s"] == pytest.approx(0.2)
    assert m["overall_throughput"] == pytest.approx(4 * 131 / 0.9)
    o = offline_metrics(10, 1000, 500, 5.0)
    assert o["request_throughput"] == 2.0 and o["output_throughput"] == 100.0
    assert o["total_token_throughput"] == 300.0
    with pytest.raises(ValueError):
        offline_metrics(1, 1, 1, 0.0)


def test_sample_lengths_range_and_fixed():
    rng = random.Random(1)
    ls = sample_lengths(500, 100, 40, 0.5, rng)
    assert all(50 <= i <= 100 and 20 <= o <= 40 for i, o in ls)
    assert len({i for i, _ in ls}) > 20
    assert sample_lengths(3, 7, 9, 1.0, rng) == [(7, 9)] * 3
    with pytest.raises(ValueError):
        sample_lengths(3, 7, 9, 0.0, rng)


def test_arrival_gaps_poisson_mean():
    gaps = arrival_gaps(4000, 8.0, random.Random(0))
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 8, rel=0.05)
    assert arrival_gaps(3, math.inf, random.Random(0)) == [0.0] * 3


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return text.split()


FROZEN: list[int] = []  # objects in gc's permanent generation while each request was served


async def _sse_server(tokens: list[str], with_usage: bool):
    """A local SSE server of the completions shape (aiohttp's own, on a free port): each request
    streams its first max_tokens of ``tokens``, one chunk each; max_tokens 999 gets a 400."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["max_tokens"] == 999:
            return web.json_response({"error": {"message": "bad"}}, status=400)
        assert body["stream"] and body["ignore_eos"]
        FROZEN.append(gc.get_freeze_count())  # the client runs in this process
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for t in tokens[: body["max_tokens"]]:
            await resp.write(f"data: {json.dumps({'choices': [{'text': t}]})}\n\n".encode())
        if with_usage:
            usage = {"completion_tokens": body["max_tokens"], "prompt_tokens": 1}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.mark.parametrize("with_usage", [True, False])
def test_run_serving_counts_tokens_and_failures(with_usage):
    reqs = [BenchRequest("p", [1, 2, 3], 4), BenchRequest("q", [1], 2), BenchRequest("r", [1], 999)]

    async def go():
        runner, url = await _sse_server(["a ", "b ", "c ", "d "], with_usage)
        try:
            return await run_serving(url, "m", reqs, _Tok(), max_concurrency=2, progress=False)
        finally:
            await runner.cleanup()

    FROZEN.clear()
    res = asyncio.run(go())
    # the client's heap was frozen while it ran (full collections skip it), and thawed after
    assert len(FROZEN) == 2 and min(FROZEN) > 1000 and gc.get_freeze_count() == 0
    assert res["completed"] == 2 and res["failed"] == 1
    assert res["total_input_tokens"] == 4 and res["total_output_tokens"] == 6
    assert res["errors"][0].startswith("HTTP 400")
    assert res["itl"]["max_ms"] >= 0 and res["ttft"]["min_ms"] > 0


def test_run_serving_reports_a_dead_server_as_failures():
    """Nothing listening: every request fails with the connection error, none hangs."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: a port nobody listens on
    res = asyncio.run(run_serving(f"http://127.0.0.1:{port}", "m", [BenchRequest("p", [1], 2)],
                                  _Tok(), max_concurrency=1, progress=False, timeout_s=10))
    assert res["completed"] == 0 and res["failed"] == 1
    assert "Connect" in res["errors"][0]


class _WordTok:
    """A tokenizer of 50 words: ids are positions, text is space-joined words."""

    words = ["the", *(f"w{i}" for i in range(49))]
    all_special_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.words)

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [self.words.index(w) for w in text.split()]


def test_serving_sweep_rows_draw_their_own_prompts(monkeypatch):
    """A row of a concurrency sweep repeating an earlier row's prompts would be served from the
    prefix cache; each row (and each --seed) draws its own."""
    import infer.cli.bench_data as bench_data
    import infer.cli.bench_serving as bench_serving
    from infer.cli.main import app
    from typer.testing import CliRunner

    sent: list[list[str]] = []

    async def fake_run(base_url, name, reqs, tok, **kw):
        sent.append([r.prompt for r in reqs])
        return {"output_throughput": 1.0, "ttft": {"median_ms": 1.0}, "itl": {"median_ms": 1.0},
                "failed": 0, "max_concurrency": kw["max_concurrency"]}

    async def fake_model(base_url):
        return "m"

    monkeypatch.setattr(bench_serving, "run_serving", fake_run)
    monkeypatch.setattr(bench_serving, "served_model", fake_model)
    monkeypatch.setattr(bench_data, "load_tokenizer", lambda path: _WordTok())
    args = ["bench", "serving", "--num-prompts", "4", "--input-len", "8", "--output-len", "2",
            "--disable-tqdm"]
    for extra in (["--max-concurrency", "1", "--max-concurrency", "2"], ["--seed", "1"]):
        res = CliRunner().invoke(app, args + extra)
        assert res.exit_code == 0, res.output
    assert len(sent) == 3 and all(len(p) == 4 for p in sent)
    assert not set(sent[0]) & set(sent[1])  # the sweep's two rows
    assert sent[2] == sent[1]  # --seed 1 is the sweep's second row: reproducible
