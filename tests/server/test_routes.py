"""Native routes, bad input, metrics and many concurrent streams against the shared real server."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from server_proc import engine_stats as _pool
from server_proc import wait_engine_idle as _wait_idle

BAD_REQUESTS = [
    # (route, raw body, expected status, expected param or None)
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b'{"prompt": 5}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -3}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1000000000}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 600}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "x", "top_p": 0}', 400, "top_p"),
    ("/v1/completions", b'{"prompt": "x", "n": 0}', 400, "n"),
    ("/v1/completions", b'{"prompt": "x", "n": 100000}', 400, "n"),
    ("/v1/completions", b'{"prompt": "x", "logprobs": 50}', 400, "logprobs"),
    ("/v1/completions", b'{"prompt": "x", "stop": [1, 2]}', 400, "stop"),
    ("/v1/completions", b'{"prompt": "x", "logit_bias": {"3": 5}}', 400, "logit_bias"),
    ("/v1/completions", b'{"prompt": "x", "suffix": "y"}', 400, "suffix"),
    ("/v1/completions", b'{"prompt": [], "max_tokens": 2}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": [999999], "max_tokens": 2}', 400, None),
    ("/v1/completions", b'{"prompt": [[], [5032332587209668608, 3]]}', 400, "prompt"),  # was a 500
    ("/v1/completions", b'{"prompt": "x", "regex": "(", "max_tokens": 2}', 400, None),
    # seeds beyond int64 crashed the engine (found by schemathesis)
    ("/v1/completions", b'{"prompt": "x", "seed": 18446744073709551614, "max_tokens": 2}', 400, "seed"),
    ("/generate", b'{"text": "x", "sampling_params": {"seed": 9223372036854775808}}', 400, "seed"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages.role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}',
     400, "tool_choice"),
    ("/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
    ("/generate", b'{"text": "x", "sampling_params": {"bogus": 1}}', 400, "bogus"),
    ("/generate", b'{"text": "x", "input_ids": [1]}', 400, "text"),
    ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": -1}}', 400, "max_new_tokens"),
    ("/detokenize", b'{"tokens": [99999999]}', 400, "tokens"),
    ("/v1/embeddings", b'{"input": "x"}', 501, None),
]


@pytest.mark.parametrize(("route", "body", "status", "param"), BAD_REQUESTS)
def test_bad_input_gets_status_and_error_body(http, route, body, status, param):
    r = http.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert "Traceback" not in r.text


def test_server_keeps_serving_after_bad_input(http):
    for route, body, _, _ in BAD_REQUESTS:
        http.post(route, content=body)
    assert http.get("/health").status_code == 200
    r = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_unknown_route_and_method(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = http.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_context_length_error_says_the_lengths(http):
    r = http.post("/v1/completions", json={"prompt": "fox " * 600, "max_tokens": 2})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "context length is 512" in msg and "tokens" in msg


def test_generate_native_shape_and_stream(http):
    body = {"text": "Hello world", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    full = http.post("/generate", json=body).json()
    assert full["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert full["meta_info"]["completion_tokens"] == len(full["output_ids"]) == 6
    texts = []
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                texts.append(json.loads(line[5:])["text"])
    assert texts[-1] == full["text"]  # SGLang streams the text so far
    batch = http.post("/generate", json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}}).json()
    assert len(batch) == 2 and all(len(b["output_ids"]) == 2 for b in batch)


def test_tokenize_detokenize_model_info(http):
    toks = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert toks["count"] == len(toks["tokens"]) and toks["max_model_len"] == 512
    assert http.post("/detokenize", json={"tokens": toks["tokens"]}).json()["text"] == "Hello world"
    info = http.get("/get_model_info").json()
    assert info["served_model_name"] == "tiny" and info["context_length"] == 512
    assert http.get("/health_generate").status_code == 200


def test_abort_request_by_rid(http):
    async def run():
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=60) as c:
            task = asyncio.create_task(c.post("/generate", json={
                "text": "x", "rid": "abort-me",
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}))
            for _ in range(200):
                await asyncio.sleep(0.05)
                r = await c.post("/abort_request", json={"rid": "abort-me"})
                if r.status_code == 200:
                    break
            return (await task).json()

    out = asyncio.run(run())
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) < 400
    assert http.post("/abort_request", json={"rid": "no-such"}).status_code == 404


def _aborted_count(http) -> float:
    """Sum of infer:num_requests_total over series with finish_reason="abort"."""
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("infer:num_requests_total{") and 'finish_reason="abort"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_disconnect_mid_request_aborts_it(http, server):
    """A non-streaming client that gives up: the server aborts its request at once.

    The client leaves as soon as the engine reports the request running (not after a fixed
    timeout, which a fast machine can outrun), and the request must be accounted as aborted.
    """
    _wait_idle(http)
    before = _aborted_count(http)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            task = asyncio.create_task(c.post("/generate", json={
                "text": "gone", "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}))
            for _ in range(2000):
                await asyncio.sleep(0.005)
                if (await c.get("/get_server_info")).json()["engine"]["running"]:
                    break
            assert not task.done(), "the request finished before the client could leave"
            task.cancel()  # closes the connection mid-request
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    eng = _wait_idle(http, timeout=10)
    assert eng["running"] == 0
    assert _aborted_count(http) == before + 1


def test_64_streams_quarter_disconnect_no_leak(http, server):
    before = _wait_idle(http)
    n, cut = 64, 16
    health_ms: list[float] = []

    async def one(c: httpx.AsyncClient, i: int) -> tuple[int, str | None, int]:
        body = {"model": "tiny", "prompt": f"stream {i} says", "max_tokens": 24, "stream": True,
                "temperature": 0.8, "seed": i, "ignore_eos": True}
        reasons, chunks = [], 0
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunks += 1
                ch = json.loads(line[5:])["choices"][0]
                if ch["finish_reason"]:
                    reasons.append(ch["finish_reason"])
                if i < cut and chunks == 2:
                    return i, None, chunks  # leave mid-stream: closes the connection
        assert len(reasons) == 1
        return i, reasons[0], chunks

    async def health(c: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            assert (await c.get("/health")).status_code == 200
            health_ms.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.05)

    async def run():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            stop = asyncio.Event()
            h = asyncio.create_task(health(c, stop))
            res = await asyncio.gather(*(one(c, i) for i in range(n)))
            stop.set()
            await h
            return res

    results = asyncio.run(run())
    finished = [r for r in results if r[0] >= cut]
    assert all(reason == "length" for _, reason, _ in finished)
    print(f"\n/health during 64 streams: max {max(health_ms):.1f} ms over {len(health_ms)} probes")
    after = _wait_idle(http)
    # every page is free or held by the prefix cache; flushing the cache frees them all
    assert after["pages_free"] + after["pages_cached"] == after["pages_total"]
    assert http.post("/flush_cache").status_code == 200
    flushed = _pool(http)
    assert flushed["pages_free"] == flushed["pages_total"] == before["pages_total"]


def test_metrics(http):
    http.post("/v1/completions", json={"prompt": "metrics", "max_tokens": 3})
    text = http.get("/metrics").text
    samples = {line.split("{")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for name in ("infer:num_requests_total", "infer:prompt_tokens_total", "infer:generation_tokens_total",
                 "infer:time_to_first_token_seconds_bucket", "infer:inter_token_latency_seconds_bucket",
                 "infer:e2e_request_latency_seconds_bucket", "infer:num_queue_reqs",
                 "infer:num_running_reqs", "infer:token_usage", "infer:cache_hit_rate"):
        assert name in samples, name
    def buckets(metric: str) -> set[str]:
        return {line.split('le="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith(f"{metric}_bucket")}

    assert buckets("infer:time_to_first_token_seconds") == {"0.1", "1.0", "10.0", "+Inf"}
    assert buckets("infer:inter_token_latency_seconds") == {"0.5", "+Inf"}
    assert buckets("infer:e2e_request_latency_seconds") == {"30.0", "+Inf"}
