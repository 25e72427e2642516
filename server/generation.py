"""One sequence's generation as the HTTP side sees it: token ids in, text deltas out.

``run_sequence`` feeds a request to the engine and turns its token increments into ``SeqDelta``s:
incremental detokenisation and stop strings (``infer.core.engine.detokenizer``: text that might
start a stop string is held back until it cannot), finish reasons and usage. Streaming and non-streaming responses are both built from
these deltas, so they give the same text by construction. ``merge`` interleaves the n sequences of
one request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from infer.core.engine.detokenizer import IncrementalDetokenizer, StopStringDetokenizer
from infer.server import ipc
from infer.server.engine_client import EngineClient
from infer.server.errors import bad_request


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float | None  # None: the first prompt token (nothing predicts it)
    top: list[tuple[int, float]]  # best first


@dataclass
class SeqDelta:
    index: int  # choice index
    text: str  # new text since the previous delta
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last delta
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None


async def run_sequence(client: EngineClient, req: ipc.AddRequest, tokenizer: Any, index: int,
                       stop: list[str], skip_special_tokens: bool,
                       no_stop_trim: bool) -> AsyncIterator[SeqDelta]:
    """Deltas of one engine request; the last one carries the finish reason.

    Text is made by the same detokenizer the engine uses for stop strings, so both agree on where
    a stop string matched; a match seen here ends the sequence even before the engine reports it.
    Without a tokenizer (--skip-tokenizer-init) the deltas carry token ids only (text "").
    """
    params = req.params
    text = None if tokenizer is None else StopStringDetokenizer(
        IncrementalDetokenizer(tokenizer, skip_special_tokens,
                               params.spaces_between_special_tokens, req.prompt_ids),
        stop, no_stop_trim)
    pending_ids: list[int] = []
    pending_lps: list[TokenLogprob] = []
    first = True
    async for out in client.stream(req):
        piece = "" if text is None else text.add(out.new_token_ids)
        pending_ids += out.new_token_ids
        pending_lps += _logprobs(out) if req.return_logprob else []
        delta = SeqDelta(index, piece, pending_ids, pending_lps, prompt_tokens=out.prompt_tokens,
                         completion_tokens=out.completion_tokens, cached_tokens=out.cached_tokens)
        if first and out.prompt_logprobs is not None:
            delta.prompt_logprobs = _prompt_logprobs(out)
        first = False
        if text is not None and text.matched is not None:
            delta.finish_reason, delta.matched_stop = "stop", text.matched
        elif out.finished:
            delta.text += "" if text is None else text.finish()
            delta.finish_reason, delta.matched_stop = _finish(out.finish_reason)
        if delta.finish_reason is not None:
            yield delta
            return  # leaving the stream early aborts the request in the engine
        if delta.text or pending_ids:
            pending_ids, pending_lps = [], []
            yield delta


def merge(streams: list[AsyncIterator[SeqDelta]]) -> AsyncIterator[SeqDelta]:
    """Interleave several sequences' deltas as they come; an error in one ends them all."""
    if len(streams) == 1:
        return streams[0]
    return _merge(streams)


async def _merge(streams: list[AsyncIterator[SeqDelta]]) -> AsyncIterator[SeqDelta]:
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(s: AsyncIterator[SeqDelta]) -> None:
        try:
            async for d in s:
                await queue.put(d)
            await queue.put(done)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
            await queue.put(err)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def fit_context(prompt_ids: list[int], max_new_tokens: int | None, context_length: int,
                allow_truncate: bool) -> tuple[list[int], int]:
    """Check (or with --allow-auto-truncate, cut) a prompt against the context; returns ids, budget."""
    n = len(prompt_ids)
    if n == 0:
        raise bad_request("the prompt is empty; send at least one token", param="prompt")
    if n >= context_length:
        if not allow_truncate:
            raise bad_request(
                f"the prompt has {n} tokens, but the model's context length is {context_length} "
                f"tokens; shorten the prompt (or start the server with --allow-auto-truncate)",
                param="prompt", code="context_length_exceeded")
        prompt_ids, n = prompt_ids[:context_length - 1], context_length - 1
    room = context_length - n
    if max_new_tokens is None:
        return prompt_ids, room
    if max_new_tokens > room:
        if not allow_truncate:
            raise bad_request(
                f"this request asks for {n + max_new_tokens} tokens ({n} in the prompt and "
                f"{max_new_tokens} to generate), but the model's context length is {context_length} "
                f"tokens; lower max_tokens to at most {room}",
                param="max_tokens", code="context_length_exceeded")
        max_new_tokens = room
    return prompt_ids, max_new_tokens


def _finish(reason: dict[str, Any] | None) -> tuple[str, int | str | None]:
    if not reason:
        return "stop", None
    return str(reason.get("type", "stop")), reason.get("matched")


def _logprobs(out: ipc.SeqOutput) -> list[TokenLogprob]:
    tops = out.top_logprobs or [[] for _ in out.new_token_ids]
    return [TokenLogprob(t, float(lp), [(int(i), float(v)) for i, v in top])
            for t, lp, top in zip(out.new_token_ids, out.logprobs, tops, strict=False)]


def _prompt_logprobs(out: ipc.SeqOutput) -> list[TokenLogprob]:
    """Prompt logprobs from (token id, logprob or None) pairs (None at the first position)."""
    pairs = out.prompt_logprobs or []
    tops = out.prompt_top_logprobs or [None] * len(pairs)
    return [TokenLogprob(int(tid), None if lp is None else float(lp), list(top or []))
            for (tid, lp), top in zip(pairs, tops, strict=False)]
