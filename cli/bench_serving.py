"""Serving benchmark: an async client against any OpenAI-compatible ``/v1/completions`` URL.

Requests stream (SSE); the client stamps the arrival of every content chunk. Arrival times follow
a Poisson process at ``request_rate`` requests/s (``inf``: all at once) and at most
``max_concurrency`` requests are in flight. Each request asks for exactly its output length
(``max_tokens`` with ``ignore_eos``); output tokens are
counted from the server's usage report, or by re-tokenizing the text where it sends none.

The streams are read with aiohttp (as SGLang's bench_serving does): its C HTTP parser costs the
client about a third of the CPU per streamed token that httpx's pure-Python one did (34 against
97 us here), CPU a client on the server's machine takes from the server it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from infer.cli.bench_data import BenchRequest
from infer.cli.bench_metrics import RequestRecord, serving_metrics


async def _one(session: aiohttp.ClientSession, url: str, model: str, req: BenchRequest,
               tokenizer: Any, extra: dict[str, Any]) -> RequestRecord:
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len, "temperature": 0.0,
            "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **extra}
    rec = RequestRecord(start=time.perf_counter(), input_tokens=req.input_len)
    text: list[str] = []
    usage_tokens = None
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return rec
            async for raw in resp.content:  # one line at a time
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text") or ""
                    if piece:
                        rec.chunk_times.append(now)
                        text.append(piece)
        rec.end = time.perf_counter()
        rec.output_tokens = (usage_tokens if usage_tokens is not None
                             else len(tokenizer.encode("".join(text), add_special_tokens=False)))
        rec.ok = bool(rec.chunk_times)
        if not rec.ok:
            rec.error = "no tokens streamed"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # ValueError: bad JSON
        rec.error = f"{type(exc).__name__}: {exc}"
    return rec


def arrival_gaps(n: int, request_rate: float, rng: random.Random) -> list[float]:
    """Seconds to wait before each request: exponential gaps (Poisson arrivals), 0 for inf."""
    if request_rate <= 0:
        raise ValueError("request rate must be positive (inf for all at once)")
    if math.isinf(request_rate):
        return [0.0] * n
    return [rng.expovariate(request_rate) for _ in range(n)]


@contextlib.asynccontextmanager
async def _heap_frozen() -> AsyncIterator[None]:
    """The client's heap from start-up (the tokenizer, transformers: about 360,000 objects) made
    each full collection during a run take 165-195 ms here, a pause in every stream's timestamps
    (one of them in each one-client row's first time to first token: 240 against 45-60 ms).
    Frozen for the run, the collections skip it (as vLLM's serving benchmark does); thawed after."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def run_serving(base_url: str, model: str, requests: list[BenchRequest], tokenizer: Any, *,
                      request_rate: float = math.inf, max_concurrency: int | None = None,
                      seed: int = 0, progress: bool = True, timeout_s: float = 600.0,
                      extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every request once; returns serving_metrics plus the settings."""
    from tqdm.auto import tqdm

    url = base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    gaps = arrival_gaps(len(requests), request_rate, random.Random(seed))
    bar = tqdm(total=len(requests), desc=f"serving c={max_concurrency or 'inf'}", disable=not progress)
    conn = aiohttp.TCPConnector(limit=max_concurrency or len(requests) or 1)
    async with _heap_frozen(), aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s), connector=conn) as client:

        async def limited(req: BenchRequest) -> RequestRecord:
            if sem is None:
                rec = await _one(client, url, model, req, tokenizer, extra_body or {})
            else:
                async with sem:
                    rec = await _one(client, url, model, req, tokenizer, extra_body or {})
            bar.update(1)
            return rec

        start = time.perf_counter()
        tasks = []
        for req, gap in zip(requests, gaps, strict=True):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(limited(req)))
        records = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    result = serving_metrics(records, duration)
    result.update({"base_url": base_url, "model": model, "num_prompts": len(requests),
                   "request_rate": request_rate, "max_concurrency": max_concurrency})
    return result


async def served_model(base_url: str) -> str:
    """The first model id the server lists at /v1/models."""
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.get(base_url.rstrip("/") + "/v1/models")
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]
