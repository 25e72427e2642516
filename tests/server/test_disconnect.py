"""Clients that leave mid-stream: their requests end in the engine at once, nobody else notices.

One server of its own, so that its log holds only this test's lines: 64 concurrent streams of
which 16 hang up after two chunks. The 48 others must give the tokens they give alone (greedy;
where a batch's arithmetic differs from one row's, see ``_same_or_tie``), the 16 cut requests must stop generating (their token budget is large and ignores EOS, so a missed
abort shows as hundreds of extra tokens), no traceback may be logged, the page pool must return to
its starting free count, and a SIGTERM afterwards must shut down cleanly.
"""

from __future__ import annotations

import asyncio
import json
import signal
from types import SimpleNamespace

import httpx
import pytest
from infer.server import ipc
from infer.server.app import build_app
from infer.server.serving import ServerState
from server_proc import engine_stats as _engine
from server_proc import wait_engine_idle as _wait_idle

N_STREAMS, N_CUT = 64, 16
KEPT_TOKENS, CUT_BUDGET = 24, 480


@pytest.fixture(scope="module")
def srv(start_server):
    return start_server("--skip-server-warmup", "--max-total-tokens", "16384")


def _body(i: int, stream: bool) -> dict:
    cut = i < N_CUT
    return {"prompt": f"stream {i} says", "temperature": 0, "stream": stream, "ignore_eos": True,
            "max_tokens": CUT_BUDGET if cut else KEPT_TOKENS, "logprobs": 2}


async def _one(c: httpx.AsyncClient, i: int) -> list[str] | None:
    tokens, chunks = [], 0
    async with c.stream("POST", "/v1/completions", json=_body(i, True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunks += 1
            tokens += json.loads(line[5:])["choices"][0]["logprobs"]["tokens"]
            if i < N_CUT and chunks == 2:
                return None  # leaving the block closes the connection mid-stream
    return tokens


def _same_or_tie(alone: dict, got: list[str]) -> bool:
    """``got`` equals the tokens alone, or first leaves them where the two best candidates alone
    were tied within rounding (a batch sums in another order than one row does, and the KV cache
    holds float16: the greedy pick may flip there, and only there; issue 13 item 1 is about that).
    Logprobs here step by 1/128, so "tied" is a gap of at most two steps."""
    want = alone["tokens"]
    if got == want:
        return True
    k = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    if k >= len(want) or k >= len(got):
        return False
    best = sorted(alone["top_logprobs"][k].values(), reverse=True)
    return len(best) == 2 and best[0] - best[1] <= 2 / 128 and got[k] in alone["top_logprobs"][k]


def test_cut_streams_abort_at_once_and_others_are_unaffected(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        start = _wait_idle(c)
        alone = {i: c.post("/v1/completions", json=_body(i, False)).json()["choices"][0]["logprobs"]
                 for i in range(N_CUT, N_STREAMS)}
        before = _wait_idle(c)

        async def run() -> list[list[str] | None]:
            limits = httpx.Limits(max_connections=N_STREAMS + 4)
            async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as ac:
                return await asyncio.gather(*(_one(ac, i) for i in range(N_STREAMS)))

        streamed = asyncio.run(run())
        after = _wait_idle(c)
        assert c.get("/get_server_info").json()["in_flight_requests"] == 0
        assert all(t is None for t in streamed[:N_CUT])
        differ = [(i, alone[i]["tokens"], streamed[i]) for i in range(N_CUT, N_STREAMS)
                  if not _same_or_tie(alone[i], streamed[i])]
        assert not differ, f"{len(differ)} streams differ from their tokens alone, first: {differ[0]}"
        generated = after["generated_tokens"] - before["generated_tokens"]
        by_cut = generated - (N_STREAMS - N_CUT) * KEPT_TOKENS
        # an abort that reaches the engine within a step leaves each cut stream a few tokens past
        # its second chunk; one that never arrives lets all 16 run their 480
        print(f"\n{N_CUT} cut streams generated {by_cut} tokens in all (budget {N_CUT * CUT_BUDGET})")
        assert by_cut < N_CUT * CUT_BUDGET // 4, f"cut streams generated {by_cut} tokens"
        assert after["pages_free"] + after["pages_cached"] == after["pages_total"]
        assert c.post("/flush_cache").status_code == 200
        assert _engine(c)["pages_free"] == start["pages_free"]
    assert srv.stop(signal.SIGTERM) == 0
    log = srv.output()
    for bad in ("Traceback", "ERROR", "ZMQError", "already running"):
        assert bad not in log, f"{bad!r} in the server log:\n{log[-3000:]}"


class _SlowEngine:
    """An EngineClient stand-in: one token every 20 ms until aborted; records how streams end."""

    def __init__(self) -> None:
        self.dead = None
        self.ready = SimpleNamespace(generation_config={}, model_path="m", eos_token_ids=[0])
        self.ended: dict[str, str] = {}

    async def stream(self, req):
        reason = "aborted"
        try:
            for k in range(req.params.max_new_tokens):
                await asyncio.sleep(0.02)
                yield ipc.SeqOutput(req.rid, [5], False, None, len(req.prompt_ids), k + 1, 0)
            reason = "ran to the end"
        finally:
            self.ended[req.rid] = reason


def test_disconnect_while_waiting_for_a_token_aborts_without_error(tiny_dir):
    """In process, deterministic: the client leaves while the stream waits for the engine (the
    case that raised 'aclose(): asynchronous generator is already running' and left the request
    running). The stream must end as aborted at once, nothing raised, nothing left in flight."""
    from transformers import AutoTokenizer

    engine = _SlowEngine()
    state = ServerState(args=SimpleNamespace(), client=engine, tokenizer=AutoTokenizer.from_pretrained(tiny_dir),
                        chat_template=None, model_name="m", context_length=512)
    app = build_app(state)
    body = json.dumps({"prompt": "Hello", "max_tokens": 400, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "root_path": "", "query_string": b"", "server": ("test", 80), "client": ("test", 1),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def run() -> list[dict]:
        gone, sent, queue = asyncio.Event(), [], [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if queue:
                return queue.pop()
            await gone.wait()  # every receiver (Starlette's and the route's) sees the disconnect
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if sum(m["type"] == "http.response.body" for m in sent) == 2:
                gone.set()  # the client leaves after two chunks, between two tokens

        await asyncio.wait_for(app(scope, receive, send), 10)
        for _ in range(100):  # the abort is delivered by a task of its own
            if engine.ended:
                break
            await asyncio.sleep(0.01)
        return sent

    sent = asyncio.run(run())
    assert sent[0]["status"] == 200
    assert list(engine.ended.values()) == ["aborted"]
    assert state.in_flight == 0
