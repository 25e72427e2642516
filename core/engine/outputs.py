"""Plain, picklable values that cross the engine boundary (ZMQ or in-process)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestOutput:
    """What one request produced since the previous ``EngineCore.step()``.

    Token-level only: text is made by the consumer with ``infer.core.engine.detokenizer`` (the
    server in its HTTP process, the offline Engine in-process). When ``finish_reason`` is a
    stop string match (``{"type": "stop", "matched": "<str>"}``) the consumer's
    StopStringDetokenizer trims the text the same way the engine detected it.
    """

    rid: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None  # {"type": "stop"|"length"|"abort", "matched"/"length"/"message": ...}
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_logprobs: list[float] = field(default_factory=list)  # one per new token when asked
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # prompt logprobs, sent once (with the first output): (token id, logprob or None for the first)
    prompt_logprobs: list[tuple[int, float | None]] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    time_to_first_token: float | None = None  # seconds from arrival, set once the first token exists
    e2e_latency: float | None = None  # seconds from arrival to finish


@dataclass
class EngineStats:
    running: int
    queued: int
    pages_total: int
    pages_free: int
    pages_cached: int
    page_size: int
    prefix_cache_hit_rate: float  # cached prompt tokens / prompt tokens, over all admitted requests
    prompt_tokens: int
    generated_tokens: int
    cached_tokens: int
    num_retractions: int
    num_preemptions: int

    @property
    def token_usage(self) -> float:
        used = self.pages_total - self.pages_free - self.pages_cached
        return used / self.pages_total if self.pages_total else 0.0


def make_output(req: Any) -> RequestOutput:
    """Pack what a Request produced since it was last reported (tokens known on the host, their
    logprobs, the prompt logprobs once) and mark it reported."""
    known = len(req.output_ids) - req.num_pending
    new = req.output_ids[req.num_sent:known]
    lo = req.num_sent
    req.num_sent = known
    out = RequestOutput(
        rid=req.rid, new_token_ids=list(new), finished=req.finished,
        finish_reason=req.finish_reason if req.finished else None,
        prompt_tokens=len(req.prompt_ids), completion_tokens=known,
        cached_tokens=req.cached_tokens,
        output_logprobs=req.output_logprobs[lo:lo + len(new)] if req.return_logprob else [],
        output_top_logprobs=req.output_top_logprobs[lo:lo + len(new)]
        if req.return_logprob and req.top_logprobs_num else [])
    if req.return_logprob and req.logprob_start_len >= 0 and not req.prompt_logprobs_sent \
            and (req.output_ids or req.finished):
        req.prompt_logprobs_sent = True
        start, n = req.logprob_start_len, len(req.prompt_ids)
        lps = req.prompt_logprobs + [None] * (n - len(req.prompt_logprobs))
        tops = req.prompt_top_logprobs + [None] * (n - len(req.prompt_top_logprobs))
        out.prompt_logprobs = [(req.prompt_ids[i], lps[i]) for i in range(start, n)]
        out.prompt_top_logprobs = tops[start:] if req.top_logprobs_num else None
    if req.first_token_time is not None:
        out.time_to_first_token = req.first_token_time - req.arrival_time
    if req.finished and req.finish_time is not None:
        out.e2e_latency = req.finish_time - req.arrival_time
    return out


def engine_stats(scheduler: Any, pool: Any, cache: Any, counters: dict[str, int]) -> EngineStats:
    """The engine's gauges and counters (``counters``: prompt, generated and cached tokens)."""
    c = counters
    return EngineStats(
        running=len(scheduler.running), queued=len(scheduler.waiting),
        pages_total=pool.capacity, pages_free=pool.num_free, pages_cached=cache.cached_pages,
        page_size=pool.page_size,
        prefix_cache_hit_rate=c["cached_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
        prompt_tokens=c["prompt_tokens"], generated_tokens=c["generated_tokens"],
        cached_tokens=c["cached_tokens"], num_retractions=scheduler.num_retractions,
        num_preemptions=scheduler.num_preemptions)
