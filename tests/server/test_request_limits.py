"""A huge request never stalls the others: size limits first, long prompts tokenised off the loop.

In process (the app on httpx's ASGI transport, no engine needed: every request here is refused
before it would reach one), with a tokenizer that blocks inside ``encode`` until the test lets it
go. /health must answer while a prompt is being tokenised; before the fix the event loop itself was
inside ``encode`` and /health waited for it. The real server gets the 5 MB body at the end.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import httpx
import pytest
from infer.server import request_limits
from infer.server.app import build_app
from infer.server.errors import unavailable
from infer.server.serving import ServerState

CONTEXT = 64


class BlockingTokenizer:
    """Every token string has 4 characters; ``encode`` waits for ``release`` (at most 10 s)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_by_test: list[bool] = []
        self.encoded: list[int] = []

    def __len__(self) -> int:
        return 100

    def convert_ids_to_tokens(self, ids):
        return ["abcd" for _ in ids]

    def encode(self, text, add_special_tokens=True):
        self.encoded.append(len(text))
        self.entered.set()
        self.released_by_test.append(self.release.wait(10))
        return [1] * (CONTEXT + 1)


async def _no_engine(req):
    raise unavailable("no engine in this test")
    yield


def _app(tokenizer, **args):
    client = SimpleNamespace(dead=None, stream=_no_engine,
                             ready=SimpleNamespace(generation_config={}, model_path="m", eos_token_ids=[0]))
    state = ServerState(args=SimpleNamespace(**args), client=client, tokenizer=tokenizer,
                        chat_template=None, model_name="m", context_length=CONTEXT)
    return build_app(state)


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def test_health_answers_while_a_prompt_is_tokenised(monkeypatch):
    monkeypatch.setattr(request_limits, "INLINE_CHARS", 100)  # the 400-character prompt is long
    tok = BlockingTokenizer()

    async def run():
        async with _client(_app(tok)) as c:
            big = asyncio.create_task(c.post("/v1/completions", json={"prompt": "x" * 400}))
            while not tok.entered.is_set():
                await asyncio.sleep(0.01)
            health = await c.get("/health")
            tok.release.set()
            return health, await big

    health, big = asyncio.run(run())
    assert health.status_code == 200
    assert tok.released_by_test == [True], "/health waited for the tokenizer"
    assert big.status_code == 400 and big.json()["error"]["code"] == "context_length_exceeded"


class ThreadRecordingTokenizer(BlockingTokenizer):
    """Records the thread each ``encode`` ran on; never blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()
        self.threads: list[threading.Thread] = []

    def encode(self, text, add_special_tokens=True):
        self.threads.append(threading.current_thread())
        return super().encode(text, add_special_tokens)


def test_short_prompts_are_tokenised_on_the_event_loop(monkeypatch):
    """Up to ``INLINE_CHARS`` in all, on the loop's own thread (a worker's hand-off cost more
    than a short prompt's encode); beyond it, in a worker thread."""
    monkeypatch.setattr(request_limits, "INLINE_CHARS", 100)
    tok = ThreadRecordingTokenizer()

    async def run(prompt):
        async with _client(_app(tok)) as c:
            return await c.post("/v1/completions", json={"prompt": prompt})

    for prompt in ("x" * 100, ["x" * 40, "y" * 60], "x" * 101, ["x" * 60, "y" * 41]):
        tok.threads.clear()
        assert asyncio.run(run(prompt)).status_code == 400  # (context_length_exceeded)
        inline = sum(map(len, [prompt] if isinstance(prompt, str) else prompt)) <= 100
        assert tok.threads and all((t is threading.main_thread()) == inline for t in tok.threads), prompt


def test_text_beyond_any_fit_is_refused_without_tokenising():
    tok = BlockingTokenizer()
    tok.release.set()
    bound = 2 * CONTEXT * 4  # 2 x context x the longest token string

    async def run(app, prompt):
        async with _client(app) as c:
            return await c.post("/v1/completions", json={"prompt": prompt})

    r = asyncio.run(run(_app(tok), "y" * (bound + 1)))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "characters" in r.json()["error"]["message"] and tok.encoded == []
    r = asyncio.run(run(_app(tok), "y" * bound))  # within the bound: tokenised, then refused
    assert r.status_code == 400 and tok.encoded == [bound]
    # with --allow-auto-truncate the text is cut to the bound, not refused unread
    tok.encoded.clear()
    r = asyncio.run(run(_app(tok, allow_auto_truncate=True), "z" * (bound * 10)))
    assert tok.encoded == [bound] and r.status_code == 503  # it went on to the (absent) engine


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_the_limit_is_413(monkeypatch, chunked):
    monkeypatch.setenv("INFER_MAX_REQUEST_BYTES", "1000")
    tok = BlockingTokenizer()
    body = b'{"prompt": "' + b"w" * 2000 + b'"}'

    async def chunks():
        for i in range(0, len(body), 100):
            yield body[i:i + 100]

    async def run():
        async with _client(_app(tok)) as c:
            return await c.post("/v1/completions", content=chunks() if chunked else body,
                                headers={"content-type": "application/json"})

    r = asyncio.run(run())
    assert r.status_code == 413, r.text
    assert "INFER_MAX_REQUEST_BYTES" in r.json()["error"]["message"] and tok.encoded == []


def test_real_server_refuses_5mb_prompt_and_keeps_serving(server, http):
    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            big = asyncio.create_task(c.post("/v1/completions", json={"prompt": "fox " * 1_250_000}))
            probes = []
            while not big.done():
                probes.append((await c.get("/health")).status_code)
                await asyncio.sleep(0.01)
            return await big, probes

    big, probes = asyncio.run(run())
    assert big.status_code == 400 and big.json()["error"]["code"] == "context_length_exceeded"
    assert all(code == 200 for code in probes)
    assert http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).status_code == 200
