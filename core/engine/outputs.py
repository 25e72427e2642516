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
