"""Admission: turning what a client asked for into queued Requests.

``Admission.make_request`` applies the engine's sampling defaults; ``add`` validates a request
against the model and the pool, fans an n > 1 request out into n choices ("<rid>-0" ..), and
queues all of them or none. ``RequestTable`` is the engine's index of live requests and of n > 1
groups; the stepping core looks requests up and forgets them through it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from infer.core.engine.detokenizer import IncrementalDetokenizer, StopStringDetokenizer
from infer.core.engine.request import QueueFullError, Request
from infer.core.sampling.params import SamplingParams


@dataclass
class RequestTable:
    """Live requests by rid, and n > 1 groups (original rid -> choice rids)."""

    reqs: dict[str, Request] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)  # choice rid -> original rid

    def in_use(self, rid: str) -> bool:
        return rid in self.reqs or rid in self.groups

    def forget(self, rid: str) -> None:
        """Drop a finished request (and its n > 1 group once every choice has ended)."""
        self.reqs.pop(rid, None)
        parent = self.parent.pop(rid, None)
        if parent is not None and parent in self.groups and \
                not any(r in self.reqs for r in self.groups[parent]):
            del self.groups[parent]


class Admission:
    def __init__(self, table: RequestTable, scheduler: Any, *, arch: Any, tokenizer: Any,
                 grammar: Any, eos_ids: tuple[int, ...], pool_tokens: int,
                 defaults: dict[str, Any], seed: int | None) -> None:
        self.table = table
        self.scheduler = scheduler
        self.arch = arch
        self.tokenizer = tokenizer
        self.grammar = grammar
        self.eos_ids = eos_ids
        self.pool_tokens = pool_tokens  # tokens the KV pool holds
        self.defaults = defaults
        self._rng = random.Random(seed)

    def make_request(self, rid: str, input_ids: list[int], sampling_params: Any = None,
                     **kwargs: Any) -> Request:
        params = sampling_params if isinstance(sampling_params, SamplingParams) else \
            SamplingParams.from_dict(sampling_params, self.defaults)
        return Request(rid=rid, prompt_ids=list(input_ids), params=params, **kwargs)

    def add(self, req: Request) -> list[str]:
        """Queue a request (all n choices, or nothing: every check runs before any is queued)."""
        if self.table.in_use(req.rid):
            raise ValueError(f"rid: request id {req.rid!r} is already in use")
        self.validate(req)
        n = req.params.n
        reqs = [req] if n == 1 else [self._sibling(req, i) for i in range(n)]
        for r in reqs[1:]:
            r.after = reqs[0]
        sched = self.scheduler
        cap = sched.cfg.max_queued_requests
        if cap is not None and len(sched.waiting) + len(reqs) > cap:
            raise QueueFullError(
                f"the request queue is full ({len(sched.waiting)} waiting, --max-queued-requests "
                f"{cap}); retry later or raise --max-queued-requests")
        for r in reqs:
            self._prepare(r)
        if n > 1:
            self.table.groups[req.rid] = [r.rid for r in reqs]
            self.table.parent.update({r.rid: req.rid for r in reqs})
        for r in reqs:
            sched.add(r)
            self.table.reqs[r.rid] = r
        return [r.rid for r in reqs]

    def _prepare(self, r: Request) -> None:
        r.eos_ids = self.eos_ids
        r.max_total_len = self.arch.context_length
        r.seed = r.params.seed if r.params.seed is not None else self._rng.getrandbits(62)
        if r.params.stop:
            r.stop_checker = StopStringDetokenizer(
                IncrementalDetokenizer(self.tokenizer, r.params.skip_special_tokens,
                                       r.params.spaces_between_special_tokens, r.prompt_ids),
                r.params.stop)
        if r.params.grammar is not None:
            r.grammar = self.grammar.matcher(*r.params.grammar)  # GrammarError: a ValueError

    @staticmethod
    def _sibling(req: Request, i: int) -> Request:
        p = SamplingParams(**{**req.params.to_dict(), "n": 1})
        if p.seed is not None:
            # distinct but reproducible samples per choice, kept in the signed 64-bit range
            p.seed = (p.seed + i + (1 << 63)) % (1 << 64) - (1 << 63)
        return Request(rid=f"{req.rid}-{i}", prompt_ids=list(req.prompt_ids), params=p,
                       priority=req.priority, return_logprob=req.return_logprob,
                       top_logprobs_num=req.top_logprobs_num,
                       logprob_start_len=req.logprob_start_len, stream=req.stream)

    def validate(self, req: Request) -> None:
        n, vocab = len(req.prompt_ids), self.arch.vocab_size
        if n == 0:
            raise ValueError("input_ids: the prompt is empty")
        if n >= self.arch.context_length:
            raise ValueError(f"input_ids: the prompt has {n} tokens, the model's context length is "
                             f"{self.arch.context_length}; shorten the prompt")
        if n + 1 > self.pool_tokens:
            raise ValueError(f"input_ids: the prompt has {n} tokens but the KV pool holds "
                             f"{self.pool_tokens}; raise --max-total-tokens")
        bad = [t for t in req.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"input_ids: token id {bad[0]} is outside the vocabulary (size {vocab})")
        p = req.params
        if p.stop and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer, and this engine runs with "
                             "--skip-tokenizer-init; use stop_token_ids")
        if p.grammar is not None and self.grammar is None:
            raise ValueError(f"{p.grammar[0]}: grammar-constrained decoding needs --grammar-backend "
                             f"xgrammar (and a tokenizer)")
        if req.top_logprobs_num < 0 or req.top_logprobs_num > vocab:
            raise ValueError(f"top_logprobs_num: must be in [0, {vocab}]")
