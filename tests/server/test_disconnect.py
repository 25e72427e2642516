"""Clients that leave mid-stream: their requests end in the engine at once, nobody else notices.

One server of its own, so that its log holds only this test's lines: 64 concurrent streams, of
which 16 (on /v1/completions) hang up after two chunks. The 48 others (streamed from the native
/generate, which answers token ids) must give the token ids they give alone (greedy; where a
batch's arithmetic differs from one row's, see ``_same_or_tie``), the 16 cut requests must stop
generating (their token budget is large and ignores EOS, so a missed abort shows as hundreds of
extra tokens), no traceback may be logged, the page pool must return to its starting free count,
and a SIGTERM afterwards must shut down cleanly.
"""

from __future__ import annotations

import asyncio
import gc
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
# Candidates asked for alone, and how far below the best one a batch's pick may lie (see
# _same_or_tie): the server runs the float32 checkpoint in float16 (--dtype auto), whose logits
# were measured up to 0.11 nats from float32's, so two candidates within about twice that of each
# other may swap places between a batch and one row.
TOP_N, TIE_NATS = 5, 0.25


@pytest.fixture(scope="module")
def srv(start_server):
    return start_server("--skip-server-warmup", "--max-total-tokens", "16384")


def _prompt(i: int) -> str:
    return f"stream {i} says"


def _generate_body(i: int, stream: bool) -> dict:
    """A kept request on the native /generate, whose answers carry token ids (the OpenAI routes
    give token strings, and many byte-level tokens decode to the same '\ufffd'); alone, with the
    TOP_N best candidates at each position (the streams leave them out: each chunk of a /generate
    stream repeats everything so far)."""
    body = {"text": _prompt(i), "stream": stream,
            "sampling_params": {"temperature": 0, "max_new_tokens": KEPT_TOKENS, "ignore_eos": True}}
    return body if stream else {**body, "return_logprob": True, "top_logprobs_num": TOP_N}


async def _cut(c: httpx.AsyncClient, i: int) -> None:
    """A /v1/completions stream that hangs up after its second chunk (asking for logprobs makes
    every token a chunk of its own, even one whose text is held back as an incomplete character)."""
    body = {"prompt": _prompt(i), "temperature": 0, "stream": True, "ignore_eos": True,
            "max_tokens": CUT_BUDGET, "logprobs": 2}
    chunks = 0
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunks += 1
                if chunks == 2:
                    return None  # leaving the block closes the connection mid-stream
    raise AssertionError(f"stream {i} ended after {chunks} chunks, before it could be cut")


async def _kept(c: httpx.AsyncClient, i: int) -> list[int]:
    """A /generate stream read to its end: its token ids (each chunk repeats all so far)."""
    ids, done = None, False
    async with c.stream("POST", "/generate", json=_generate_body(i, True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data:"):
                ids = json.loads(line[5:])["output_ids"]
    assert done and ids is not None, f"stream {i} ended without [DONE]"
    return ids


def _first_difference(want: list[int], got: list[int]) -> int:
    return next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))


def _same_or_tie(alone: dict, got: list[int]) -> bool:
    """``got`` equals the token ids alone, or first leaves them where the batch's token was, alone,
    among the TOP_N best candidates and within TIE_NATS of the best: a batch sums in another order
    than one row does, the logits are float16 and the KV cache holds float16, so the greedy pick
    may flip between near-tied candidates (issue 13 item 1 is about that). Past that first
    difference the two continue from different tokens, so only that position is judged. Ids, not
    strings: the OpenAI logprobs key candidates by their text, which merges every byte-level
    token that decodes to '\ufffd' and so hides near ties."""
    want = alone["output_ids"]
    if got == want:
        return True
    if len(got) != len(want):
        return False
    k = _first_difference(want, got)
    top = {tid: lp for lp, tid, _ in alone["meta_info"]["output_top_logprobs"][k]}
    return got[k] in top and max(top.values()) - top[got[k]] <= TIE_NATS


def _difference(i: int, alone: dict, got: list[int]) -> str:
    want = alone["output_ids"]
    k = _first_difference(want, got)
    top = alone["meta_info"]["output_top_logprobs"][k] if k < len(want) else []
    return (f"stream {i}: alone {want}, in the batch {got}; first difference at {k}, where the "
            f"best (logprob, id) alone were {[t[:2] for t in top]}")


def test_cut_streams_abort_at_once_and_others_are_unaffected(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        start = _wait_idle(c)
        alone = {i: c.post("/generate", json=_generate_body(i, False)).json()
                 for i in range(N_CUT, N_STREAMS)}
        assert all(len(a["output_ids"]) == KEPT_TOKENS for a in alone.values())
        before = _wait_idle(c)

        async def run() -> list[list[int] | None]:
            limits = httpx.Limits(max_connections=N_STREAMS + 4)
            async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as ac:
                return await asyncio.gather(*(_cut(ac, i) if i < N_CUT else _kept(ac, i)
                                              for i in range(N_STREAMS)))

        # No garbage collection in this (the client's) process while the streams run: a full one
        # of pytest's heap took 0.2-0.4 s, during which the cut clients could not hang up and the
        # engine went on generating for them (up to 2283 tokens in all, against 60-180 without)
        gc.collect()
        gc.disable()
        try:
            streamed = asyncio.run(run())
        finally:
            gc.enable()
        after = _wait_idle(c)
        assert c.get("/get_server_info").json()["in_flight_requests"] == 0
        assert all(t is None for t in streamed[:N_CUT])
        differ = [_difference(i, alone[i], streamed[i]) for i in range(N_CUT, N_STREAMS)
                  if not _same_or_tie(alone[i], streamed[i])]
        assert not differ, f"{len(differ)} streams differ from their token ids alone:\n" + "\n".join(differ)
        ties = sum(streamed[i] != alone[i]["output_ids"] for i in range(N_CUT, N_STREAMS))
        generated = after["generated_tokens"] - before["generated_tokens"]
        by_cut = generated - (N_STREAMS - N_CUT) * KEPT_TOKENS
        # an abort that reaches the engine within a step leaves each cut stream a few tokens past
        # its second chunk; one that never arrives lets all 16 run their 480
        print(f"\n{N_CUT} cut streams generated {by_cut} tokens in all (budget {N_CUT * CUT_BUDGET}); "
              f"{ties} kept streams left their tokens alone at a near tie")
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
