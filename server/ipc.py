"""Messages between the HTTP process and the engine process (pickled over ZMQ PUSH/PULL).

HTTP -> engine: ``AddRequest``, ``AbortRequest``, ``Control``.
engine -> HTTP: ``Ready`` once, then ``Outputs`` after each step, ``Rejected`` when the engine
refuses a request, ``Reply`` to a ``Control``, ``Stats`` about twice a second, ``Signalled`` when the
engine process got SIGINT or SIGTERM (the HTTP side then drains and shuts it down), ``Fatal``
before it dies of an error. The HTTP side binds both sockets; the engine connects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AddRequest:
    rid: str
    prompt_ids: list[int]
    params: Any  # infer.core.sampling.params.SamplingParams
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    stream: bool = True  # False: not streamed; the engine reports the first token, then the end


@dataclass
class AbortRequest:
    rid: str | None  # None: abort everything


@dataclass
class Control:
    call_id: int
    op: str  # "flush_cache" | "stats" | "shutdown"


@dataclass
class SeqOutput:
    """What one step produced for one request; token lists hold only the new tokens."""

    rid: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None  # {"type": "stop"|"length"|"abort", "matched": ...}
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: list[float] = field(default_factory=list)  # one per new token
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[tuple[int, float | None]] | None = None  # (token id, logprob), once
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None


@dataclass
class Outputs:
    outputs: list[SeqOutput]


@dataclass
class Rejected:
    rid: str
    status: int  # 400 or 503
    message: str


@dataclass
class Reply:
    call_id: int
    ok: bool
    payload: Any


@dataclass
class Ready:
    tokenizer: Any  # a picklable Hugging Face tokenizer
    chat_template: str | None
    eos_token_ids: list[int]
    context_length: int
    generation_config: dict[str, Any]
    model_path: str
    stats: dict[str, Any]


@dataclass
class Stats:
    stats: dict[str, Any]


@dataclass
class Signalled:
    signum: int


@dataclass
class Fatal:
    message: str
