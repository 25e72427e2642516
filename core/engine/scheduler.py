"""Scheduler: decides which requests run in the next step and how many tokens each computes.

It owns the waiting and running queues and the KVManager (page accounting); it never touches
tensors (no torch import). One ``schedule()`` returns a ScheduleBatch; after the model runner
ran it and the engine appended sampled tokens, ``update(batch)`` advances the requests.

Step choice: a prefill batch when a chunked prefill is in flight or a waiting request can be
admitted; otherwise a decode batch of every running request. With --enable-mixed-chunk the
running decode rows join the prefill batch. When the pool cannot hold the next decode tokens,
the newest / lowest-priority running requests are retracted: their computed pages go to the
prefix cache, they are requeued at the front and later recompute only what was evicted, so
their outputs do not change.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from infer.core.cache.manager import KVManager
from infer.core.config.views import SchedulerConfig
from infer.core.engine.request import QueueFullError, Request, RequestState
from infer.core.engine.scheduler_policy import order_waiting, priority_key

NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001


@dataclass
class ScheduledSeq:
    req: Request
    extend_len: int  # computes req.all_ids[req.num_computed : req.num_computed + extend_len]
    # tokens sampled from this row span's last logit rows: 0 for a prefill chunk that stops short
    # of the end of all_ids, 1 for one that reaches it and for a decode row (speculative
    # verification would sample several)
    num_sample: int = 1
    pages_from: int = 0  # req.pages[pages_from:] changed since the model runner last saw them

    @property
    def sample(self) -> bool:
        return self.num_sample > 0


@dataclass
class ScheduleBatch:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    is_prefill: bool = False  # holds at least one prefill (or prefill chunk)

    @property
    def num_tokens(self) -> int:
        return sum(s.extend_len for s in self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None:
        self.cfg = config
        self.kv = kv
        self.page_size = kv.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.rng = random.Random(config.random_seed)
        self.new_token_ratio = min(1.0, NEW_TOKEN_RATIO_INIT * config.schedule_conservativeness)
        self.num_retractions = 0
        self.num_preemptions = 0
        self.oom_finished: list[Request] = []  # finished by the scheduler; the engine reports them

    # -- queue ---------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        cap = self.cfg.max_queued_requests
        if cap is not None and len(self.waiting) >= cap:
            raise QueueFullError(
                f"the request queue is full ({len(self.waiting)} waiting, --max-queued-requests "
                f"{cap}); retry later or raise --max-queued-requests")
        req.state = RequestState.WAITING
        self.waiting.append(req)

    def abort(self, rid: str) -> Request | None:
        """Remove a queued or running request, freeing its pages. Returns it, or None."""
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                return req
        for req in self.running:
            if req.rid == rid:
                self.running.remove(req)
                self.kv.release(req)
                return req
        return None

    def finish(self, req: Request) -> None:
        """A request ended (stop/length): cache its pages and drop it. Under overlap scheduling
        the sampled token that ends it can arrive after the request was retracted (waiting)."""
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
            return
        self.running.remove(req)
        self.kv.release(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def prefill_pending(self) -> bool:
        """A request waits for admission or is part-way through a chunked prefill."""
        return bool(self.waiting) or any(r.is_prefilling for r in self.running)

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> ScheduleBatch | None:
        batch = self._schedule_once()
        if batch is None and self.running and self.waiting:
            # a stalled chunked prefill: make room by retracting the least protected request
            stalled = [r for r in self.running if r.is_prefilling]
            others = [r for r in self._by_retraction_order(self.running)
                      if r not in stalled[:1] and self._grows(r)]
            if others:
                self.retract(others[0])
                batch = self._schedule_once()
        if batch is not None:
            for s in batch.seqs:
                s.pages_from = self.kv.take_changed(s.req)
        return batch

    def _schedule_once(self) -> ScheduleBatch | None:
        batch = self._schedule_prefill()
        if batch is not None and batch.seqs:
            if self.cfg.enable_mixed_chunk:
                in_batch = {id(s.req) for s in batch.seqs}
                decoding = [r for r in self.running if id(r) not in in_batch and self._grows(r)]
                batch.seqs.extend(self._decode_rows(decoding))
            return batch
        decoding = [r for r in self.running if self._grows(r)]
        rows = self._decode_rows(decoding)
        return ScheduleBatch(rows, is_prefill=False) if rows else None

    @staticmethod
    def _grows(req: Request) -> bool:
        """A decoding request that needs another token. Under overlap scheduling a request whose
        pending (not yet resolved) token reached its length limit is left out: the engine
        finishes it when that token resolves. Without overlap such a request has already ended."""
        return not req.is_prefilling and req.remaining_new_tokens > 0

    def _decode_rows(self, reqs: list[Request]) -> list[ScheduledSeq]:
        """One token per request, retracting the least protected requests while the pool is
        short. A request alone that cannot grow is finished with an abort reason."""
        order = self._by_retraction_order(reqs, reverse=True)  # most protected first
        rows = []
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        i = 0
        while i < len(order):
            req = order[i]
            if self.kv.reserve(req, req.num_computed + self.cfg.decode_tokens):
                rows.append(ScheduledSeq(req, 1, num_sample=1))
                i += 1
            elif i + 1 < len(order):
                self.retract(order.pop())
            elif rows or len(self.running) > 1:
                self.retract(order.pop())
            else:
                self.running.remove(req)
                self.kv.release(req)
                req.finish({"type": "abort", "message": (
                    f"the KV pool ({self.kv.pool.capacity} pages of {self.page_size} tokens) "
                    f"cannot hold this request's {req.seq_len} tokens; raise --max-total-tokens "
                    f"or --mem-fraction-static")})
                self.oom_finished.append(req)
                order.pop()
        where = {id(r): i for i, r in enumerate(self.running)}
        rows.sort(key=lambda s: where[id(s.req)])
        return rows

    def _by_retraction_order(self, reqs: list[Request], reverse: bool = False) -> list[Request]:
        """Retract first: lowest priority, then the latest admitted (fewest outputs)."""
        lv = self.cfg.schedule_low_priority_values_first
        where = {id(r): i for i, r in enumerate(self.running)}
        key = (lambda r: (-priority_key(r, lv), -where[id(r)])) \
            if self.cfg.enable_priority_scheduling else (lambda r: -where[id(r)])
        return sorted(reqs, key=key, reverse=reverse)

    def retract(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.release(req, cache=True)
        req.state = RequestState.WAITING
        req.retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)
        self.new_token_ratio = min(1.0, NEW_TOKEN_RATIO_INIT * self.cfg.schedule_conservativeness)

    def _reserve_tokens(self, reqs: list[Request]) -> int:
        """Decode tokens to keep room for: the running requests' expected remaining outputs."""
        ratio = self.new_token_ratio
        return int(sum(r.remaining_new_tokens for r in reqs) * ratio)

    def _schedule_prefill(self) -> ScheduleBatch | None:
        cfg = self.cfg
        chunk = cfg.chunked_prefill_size if cfg.chunked_prefill_size and cfg.chunked_prefill_size > 0 \
            else None
        budget = max(cfg.max_prefill_tokens, 1)
        if chunk is not None:
            budget = min(budget, chunk)
        batch = ScheduleBatch(is_prefill=True)
        # continue in-flight chunked prefills first
        for req in self.running:
            if req.is_prefilling and budget > 0:
                if not self._add_prefill(batch, req, budget, chunk):
                    break
                budget -= batch.seqs[-1].extend_len
        if any(r.is_prefilling for r in self.running if all(s.req is not r for s in batch.seqs)):
            return batch
        if not self.waiting:
            return batch
        order = order_waiting(self.waiting, cfg.schedule_policy,
                              lambda r: self.kv.peek_prefix(r.all_ids), self.rng,
                              cfg.enable_priority_scheduling, cfg.schedule_low_priority_values_first,
                              self.running)
        for req in order:
            if budget <= 0 or (cfg.prefill_max_requests and len(batch.seqs) >= cfg.prefill_max_requests):
                break
            first = req.after
            if first is not None and not first.finished and (
                    first.state is RequestState.WAITING or first.is_prefilling):
                continue  # n > 1: wait until the first sibling has cached the prompt
            busy = {id(s.req) for s in batch.seqs}
            if len(self.running) >= cfg.max_running_requests and not self._preempt_for(req, busy):
                break
            self.kv.attach_prefix(req, self._prefix_limit(req))
            if req.retractions == 0 and not req.output_ids:
                req.cached_tokens = req.num_computed
            if not self._add_prefill(batch, req, budget, chunk, admit=True):
                self.kv.release(req, cache=False)
                req.num_computed = 0
                if not self._preempt_for(req, busy):
                    break
                self.kv.attach_prefix(req, self._prefix_limit(req))
                if not self._add_prefill(batch, req, budget, chunk, admit=True):
                    self.kv.release(req, cache=False)
                    req.num_computed = 0
                    break
            self.waiting.remove(req)
            req.state = RequestState.RUNNING
            self.running.append(req)
            budget -= batch.seqs[-1].extend_len
            if batch.seqs[-1].extend_len < req.seq_len - (req.num_computed):
                break  # a chunked prefill: one at a time
        return batch

    @staticmethod
    def _prefix_limit(req: Request) -> int | None:
        """Prompt logprobs need the logits of positions from logprob_start_len on."""
        if req.return_logprob and req.logprob_start_len >= 0 and not req.output_ids:
            return req.logprob_start_len
        return None

    def _add_prefill(self, batch: ScheduleBatch, req: Request, budget: int, chunk: int | None,
                     admit: bool = False) -> bool:
        todo = req.seq_len - req.num_computed
        extend = todo if chunk is None and not batch.seqs else min(todo, budget)
        if chunk is None and batch.seqs and todo > budget:
            return False  # unchunked prompts never split; it runs in a later batch
        if extend <= 0:
            return False
        if admit:  # keep room for the decode tokens of everything running plus this one
            others = self.running + [req]
            reserve_pages = -(-self._reserve_tokens(others) // self.page_size)
            need = self.kv.pages_needed(req, req.num_computed + extend)
            if self.kv.available_pages - need < reserve_pages and self.running:
                return False
        if not self.kv.reserve(req, req.num_computed + extend):
            return False
        batch.seqs.append(ScheduledSeq(req, extend, num_sample=int(req.num_computed + extend == req.seq_len)))
        return True

    def _preempt_for(self, req: Request, busy: set[int]) -> bool:
        """Priority preemption: retract the worst running request if ``req`` beats it by more
        than the threshold. Returns whether one was retracted."""
        cfg = self.cfg
        candidates = [r for r in self.running if id(r) not in busy]
        if not cfg.enable_priority_scheduling or not candidates:
            return False
        lv = cfg.schedule_low_priority_values_first
        worst = max(candidates, key=lambda r: (priority_key(r, lv), self.running.index(r)))
        if priority_key(worst, lv) - priority_key(req, lv) <= cfg.priority_scheduling_preemption_threshold:
            return False
        self.retract(worst)
        self.waiting.remove(worst)
        self.waiting.append(worst)
        self.num_retractions -= 1
        self.num_preemptions += 1
        return True

    # -- after the forward pass ----------------------------------------------------------------
    def update(self, batch: ScheduleBatch) -> None:
        """Advance computed counts (call after sampled tokens were appended)."""
        for s in batch.seqs:
            req = s.req
            if req.state is not RequestState.RUNNING:
                continue  # aborted or finished during the step
            req.num_computed += s.extend_len
            if s.extend_len > 1 or not s.sample:
                self.kv.cache_unfinished(req)  # share prompt pages with later (and n>1) requests
