"""Request: one sequence as the scheduler, cache and model runner see it (no tensors).

Token bookkeeping (invariants):
    all_ids = prompt_ids + output_ids
    num_computed <= len(all_ids): tokens whose K/V are in ``pages`` (kv_len)
    len(pages) * page_size >= num_computed; pages[:num_prefix_pages] are shared prefix pages
    owned by the prefix cache (locked through ``cache_handle``), the rest belong to this request.
A step runs ``all_ids[num_computed : num_computed + extend]``; when that reaches len(all_ids) the
last row's logits are sampled and one token is appended to ``output_ids``.

Overlap scheduling: a step whose sampled ids are still on the device appends a placeholder
``-(row + 1)`` (row of the model runner's future-token buffer) instead; the last ``num_pending``
entries of ``output_ids`` are such placeholders until the engine resolves them one step later.
The model runner replaces placeholders in its input ids on the device; everything that reads
token values on the host (grammar, penalties, stop checks, outputs) runs after the resolve.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from infer.core.sampling.params import SamplingParams


class RequestState(str, enum.Enum):
    WAITING = "waiting"  # queued, holds no pages
    RUNNING = "running"  # admitted, holds pages (prefilling or decoding)
    FINISHED = "finished"


class QueueFullError(RuntimeError):
    """The waiting queue holds --max-queued-requests requests; retry later."""


# eq=False: a request is equal only to itself. Value equality compared every field (token lists
# included) on each ``list.index`` / ``remove`` in the scheduler: O(batch^2 * length) per step,
# ~11 ms per decode step at batch 64 on the GPU machine (edit by the CUDA engineer, see F's report).
@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # prompt position from which prompt logprobs are wanted; -1: none
    stream: bool = False
    # new tokens are reported (``EngineCore.step``'s outputs) once this many are unreported; the
    # first token and the end are reported at once. 0: only those two (a consumer that does not
    # stream). The server sets it from --stream-interval for streamed requests.
    report_every: int = 1

    # -- state (scheduler / cache) ---------------------------------------------------------
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_pending: int = 0  # trailing placeholders in output_ids (overlap scheduling)
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)
    num_prefix_pages: int = 0
    cache_handle: Any = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    finish_reason: dict[str, Any] | None = None
    retractions: int = 0
    counted: bool = False  # prompt / cached tokens added to the engine's counters
    seed: int = 0  # effective sampling seed (params.seed or a random one drawn at admission)
    eos_ids: tuple[int, ...] = ()
    max_total_len: int = 1 << 30  # context length: the request finishes with "length" there

    # -- outputs gathered for the next step() result ---------------------------------------
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]] | None] = field(default_factory=list)
    num_sent: int = 0  # output tokens already reported
    prompt_logprobs_sent: bool = False

    # -- timestamps (time.monotonic) -------------------------------------------------------
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None

    # extra state owned by the sampler / grammar (matcher objects, stop-string detokenizer)
    grammar: Any = None
    stop_checker: Any = None
    after: Request | None = None  # n > 1: admitted only once this sibling has prefilled

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.seq_len - 1 or not self.output_ids

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for, and prompt positions still to compute."""
        return (self.return_logprob and self.logprob_start_len >= 0 and not self.output_ids
                and self.num_computed < len(self.prompt_ids))

    @property
    def remaining_new_tokens(self) -> int:
        cap = self.params.max_new_tokens
        by_len = self.max_total_len - self.seq_len
        return max(0, min(by_len, (cap if cap is not None else by_len) - len(self.output_ids)))

    def finish(self, reason: dict[str, Any]) -> None:
        self.state = RequestState.FINISHED
        self.finish_reason = reason
        self.finish_time = time.monotonic()
