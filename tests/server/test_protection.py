"""API keys, queue limit, truncation, request logs, root path and the SIGTERM drain (one server)."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import openai
import pytest

KEY, ADMIN = "sk-test-key", "sk-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def guarded(start_server):
    return start_server("--api-key", KEY, "--admin-api-key", ADMIN, "--max-running-requests", "1",
                        "--max-queued-requests", "1", "--chat-template", "chatml", "--allow-auto-truncate",
                        "--log-requests", "--log-requests-level", "3", "--fastapi-root-path", "/infer",
                        "--uvicorn-log-level", "info", "--skip-server-warmup")


def test_api_key(guarded):
    r = httpx.post(f"{guarded.url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(f"{guarded.url}/v1/completions", json={"prompt": "x", "max_tokens": 1},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(f"{guarded.url}/health").status_code == 200  # open
    off = httpx.get(f"{guarded.url}/metrics")
    assert off.status_code == 404 and "--enable-metrics" in off.json()["error"]["message"]
    bad = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    model = good.models.list().data[0].id
    assert good.completions.create(model=model, prompt="x", max_tokens=2).usage.completion_tokens == 2


def test_admin_key(guarded):
    assert httpx.get(f"{guarded.url}/get_server_info", headers=AUTH).status_code == 401
    r = httpx.get(f"{guarded.url}/get_server_info", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and r.json()["api_key"] == "***"
    assert httpx.post(f"{guarded.url}/flush_cache", headers=AUTH).status_code == 401


def test_root_path_and_chat_template_and_truncation(guarded, tiny_dir):
    from transformers import AutoTokenizer

    assert httpx.get(f"{guarded.url}/infer/health").status_code == 200
    messages = [{"role": "user", "content": "Hello world"}]
    r = httpx.post(f"{guarded.url}/v1/chat/completions", headers=AUTH,
                   json={"messages": messages, "max_tokens": 2}).json()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    chatml = "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    assert r["usage"]["prompt_tokens"] == len(tok.encode(chatml, add_special_tokens=False))
    long = httpx.post(f"{guarded.url}/v1/completions", headers=AUTH,
                      json={"prompt": "fox " * 600, "max_tokens": 4}).json()
    assert long["usage"]["prompt_tokens"] == 511 and long["usage"]["completion_tokens"] == 1


def test_request_log(guarded):
    httpx.post(f"{guarded.url}/v1/completions", headers=AUTH, json={"prompt": "log me", "max_tokens": 2, "user": "u1"})
    time.sleep(0.3)
    out = guarded.output()
    assert "route=/v1/completions user=u1" in out and "input='log me'" in out


def test_queue_full_gets_503_with_retry_after(guarded):
    """One request running (--max-running-requests 1), then three at once: the queue
    (--max-queued-requests 1) takes exactly one of them, the other two get 503 + Retry-After."""
    async def run():
        async with httpx.AsyncClient(base_url=guarded.url, headers=AUTH, timeout=120) as c:
            long = asyncio.create_task(c.post("/v1/completions", json={
                "prompt": "busy", "max_tokens": 400, "ignore_eos": True}))
            for _ in range(2000):
                await asyncio.sleep(0.005)
                info = await c.get("/get_server_info", headers={"Authorization": f"Bearer {ADMIN}"})
                if info.json()["engine"]["running"]:
                    break
            assert not long.done(), "the long request finished before the queue could fill"
            body = {"prompt": "wait", "max_tokens": 4, "ignore_eos": True}
            burst = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(3)))
            return await long, burst

    first, results = asyncio.run(run())
    assert first.status_code == 200
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 503, 503], codes
    for busy in (r for r in results if r.status_code == 503):
        assert busy.headers["retry-after"] == "1"
        assert "max-queued-requests" in busy.json()["error"]["message"]


def test_auto_tool_choice_needs_a_parser_when_the_template_names_none(guarded):
    """chatml holds no tool-call markers and no --tool-call-parser was given: a clear 400."""
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as err:
        good.chat.completions.create(model=good.models.list().data[0].id, tools=tools, max_tokens=4,
                                     messages=[{"role": "user", "content": "x"}])
    assert err.value.body["param"] == "tool_choice" and "--tool-call-parser" in err.value.body["message"]
    assert "default: --tool-call-parser" not in guarded.output()


def test_sigterm_drains_running_requests(guarded):
    """Last in this module: the server stops."""
    got: dict = {}

    async def run():
        async with httpx.AsyncClient(base_url=guarded.url, headers=AUTH, timeout=120) as c:
            # long enough that it is still running when the late request arrives, even on an
            # idle machine (the tiny model decodes a token in a few ms)
            body = {"prompt": "drain", "max_tokens": 400, "ignore_eos": True, "stream": True}
            reasons = []
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    if not got:
                        guarded.proc.send_signal(signal.SIGTERM)
                        for _ in range(200):  # until the signal handler has switched to draining
                            if (await c.get("/health")).status_code == 503:
                                break
                            await asyncio.sleep(0.01)
                        late = await c.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
                        got["late"] = late.status_code, late.json()
                    ch = json.loads(line[5:])["choices"][0]
                    if ch["finish_reason"]:
                        reasons.append(ch["finish_reason"])
            return reasons

    reasons = asyncio.run(run())
    assert reasons == ["length"]  # the running request finished
    status, body = got["late"]
    assert status == 503 and "shutting down" in body["error"]["message"]
    assert guarded.proc.wait(60) == 0
    assert "draining" in guarded.output()


def test_dead_engine_gives_503_and_exit_code(start_server):
    srv = start_server("--skip-server-warmup")
    engine = srv.engine_pid()

    async def run():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            task = asyncio.create_task(c.post("/v1/completions", json={
                "prompt": "x", "max_tokens": 480, "ignore_eos": True}))
            for _ in range(500):  # kill the engine as soon as the request is running in it
                info = (await c.get("/get_server_info")).json()
                if info.get("in_flight_requests", 0) >= 1:
                    break
                await asyncio.sleep(0.005)
            import os

            os.kill(engine, signal.SIGKILL)
            return await task

    r = asyncio.run(run())
    assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
    assert srv.proc.wait(60) == 1
