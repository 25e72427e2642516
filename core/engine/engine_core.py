"""EngineCore: the stepping core of infer. The server's engine process and the offline Engine
both drive one of these; it is single-threaded and never blocks on anything but the model.

API (all plain Python values; Request / RequestOutput / EngineStats pickle):
    core = EngineCore(server_args)          # selects the platform, loads the model, sizes the pool
    core.tokenizer, core.loaded             # HF tokenizer, LoadedModel (arch, generation_config, ...)
    core.make_request(rid, input_ids, sampling_params: dict | SamplingParams, ...) -> Request
    core.add_request(req) -> list[str]      # rids added (n > 1 expands to "<rid>-0" .. "<rid>-{n-1}")
                                            # raises QueueFullError (queue at --max-queued-requests)
                                            # or ValueError (bad params, prompt too long)
    core.abort(rid) -> bool                 # queued or running; its pages are freed; reported once
                                            # by the next step() with finish_reason type "abort"
    core.step() -> list[RequestOutput]      # one scheduling step + forward; increments per request
    core.has_work() -> bool                 # queued or running requests, a step in flight, or
                                            # unreported outputs
    core.flush_cache() -> bool              # drops the prefix cache (False while requests run)
    core.stats() -> EngineStats             # running, queued, pages, hit rate, token counters

Overlap scheduling (SGLang's overlap scheduler; on unless --disable-overlap-schedule, and off by
default on platforms whose forward runs on the host thread): ``step()`` schedules and launches
batch N+1 while batch N still runs on the device, and only then waits for N's sampled ids and
reports them. Batch N+1 takes N's tokens from the device (placeholders in ``output_ids``, see
infer.core.engine.request). Outputs are identical to the plain order; each step's tokens are
reported one ``step()`` later, and a request that stops on a sampled token (EOS, stop string)
computes one extra row that is discarded. A batch with requests whose next step needs the token
values on the host (grammar, penalties, prompt logprobs, max_new_tokens 0) is resolved at once.

Finish reasons follow SGLang: {"type": "stop", "matched": <token id or stop string>},
{"type": "length", "length": <max_new_tokens>}, {"type": "abort", "message": ...}.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from infer.core.cache.manager import KVManager
from infer.core.cache.page_pool import PagePool, kv_bytes_per_token
from infer.core.cache.plain_cache import PlainCache
from infer.core.cache.radix_cache import RadixCache
from infer.core.engine.detokenizer import IncrementalDetokenizer, StopStringDetokenizer
from infer.core.engine.model_runner import LaunchedStep, ModelRunner, StepResult
from infer.core.engine.outputs import EngineStats, RequestOutput
from infer.core.engine.request import QueueFullError, Request
from infer.core.engine.scheduler import ScheduleBatch, Scheduler, SchedulerConfig
from infer.core.sampling.defaults import sampling_defaults
from infer.core.sampling.params import SamplingParams

log = logging.getLogger(__name__)

__all__ = ["EngineCore", "QueueFullError", "Request", "RequestOutput", "EngineStats"]

DEFAULT_MEM_FRACTION = 0.8
DEFAULT_POOL_CONTEXTS = 4  # with no memory flag set, the pool holds this many full contexts


class EngineCore:
    def __init__(self, server_args: Any, platform: Any = None, loaded: Any = None) -> None:
        self.args = server_args
        if platform is None:
            from infer.core.config.gate import run_gate

            platform = run_gate(server_args).platform
        self.platform = platform
        if loaded is None:
            from infer.core.model.loader import load_model_from_args

            loaded = load_model_from_args(server_args, platform=platform)
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.arch = loaded.arch
        self.page_size = int(getattr(server_args, "page_size", None) or 1)
        self.context_length = self.arch.context_length
        self.pool = PagePool(self._num_pages(), self.page_size)
        if getattr(server_args, "disable_radix_cache", False):
            cache = PlainCache(self.pool)
        else:
            cache = RadixCache(self.pool, getattr(server_args, "radix_eviction_policy", None) or "lru")
        self.kv = KVManager(self.pool, cache)
        self.scheduler = Scheduler(SchedulerConfig.from_server_args(server_args), self.kv)
        self.eos_ids = tuple(getattr(loaded, "eos_token_ids", None) or ())
        self.grammar = self._grammar_backend()
        self.runner = ModelRunner(loaded, server_args, self.pool.num_pages, self.page_size,
                                  platform, self.grammar)
        self.defaults = sampling_defaults(getattr(server_args, "sampling_defaults", None) or "model",
                                          getattr(loaded, "generation_config", None))
        seed = getattr(server_args, "random_seed", None)
        self._rng = random.Random(seed)
        self._reqs: dict[str, Request] = {}
        self._groups: dict[str, list[str]] = {}  # n > 1: original rid -> choice rids
        self._parent: dict[str, str] = {}  # choice rid -> original rid
        self._pending: list[RequestOutput] = []  # aborts / errors to report in the next step
        self.counters = {"prompt_tokens": 0, "generated_tokens": 0, "cached_tokens": 0}
        self.overlap = not getattr(server_args, "disable_overlap_schedule", False)
        self._inflight: LaunchedStep | None = None  # launched, sampled ids not yet on the host
        log.info("KV pool: %d pages x %d tokens (%d tokens)", self.pool.capacity, self.page_size,
                 self.pool.capacity * self.page_size)

    # -- start-up helpers ------------------------------------------------------------------------
    def _num_pages(self) -> int:
        a, arch, ps = self.args, self.arch, self.page_size
        max_total = getattr(a, "max_total_tokens", None)
        if max_total:
            return -(-int(max_total) // ps) + 1
        itemsize = arch.kv_dtype.itemsize
        per_token = kv_bytes_per_token(arch.num_layers, arch.num_kv_heads, arch.head_dim, itemsize)
        frac = getattr(a, "mem_fraction_static", None)
        weights = sum(p.numel() * p.element_size() for p in self.loaded.model.parameters())
        budget = int((frac or DEFAULT_MEM_FRACTION) * self.platform.memory_available()) - weights
        tokens = budget // per_token
        if frac is None:
            tokens = min(tokens, DEFAULT_POOL_CONTEXTS * self.context_length)
        if tokens < self.page_size * 2:
            raise ValueError(
                f"mem_fraction_static: {frac or DEFAULT_MEM_FRACTION} of {self.platform.memory_available()} "
                f"bytes leaves no room for the KV cache after {weights} bytes of weights; raise "
                f"--mem-fraction-static or set --max-total-tokens")
        return tokens // ps + 1

    def _grammar_backend(self) -> Any:
        name = getattr(self.args, "grammar_backend", None) or "xgrammar"
        if name == "none":
            return None
        if name != "xgrammar":
            raise ValueError(f"grammar_backend: {name!r} is not implemented by infer; use xgrammar")
        if self.tokenizer is None:
            return None
        from infer.core.sampling.grammar import GrammarBackend

        return GrammarBackend(self.tokenizer, self.arch.vocab_size, list(self.eos_ids))

    # -- requests --------------------------------------------------------------------------------
    def make_request(self, rid: str, input_ids: list[int], sampling_params: Any = None,
                     **kwargs: Any) -> Request:
        """A Request with the engine's defaults applied (generation_config / --sampling-defaults).
        ``kwargs``: priority, return_logprob, top_logprobs_num, logprob_start_len, stream."""
        params = sampling_params if isinstance(sampling_params, SamplingParams) else \
            SamplingParams.from_dict(sampling_params, self.defaults)
        return Request(rid=rid, prompt_ids=list(input_ids), params=params, **kwargs)

    def add_request(self, req: Request) -> list[str]:
        """Queue a request (all n choices, or nothing: every check runs before any is queued)."""
        if req.rid in self._reqs or req.rid in self._groups:
            raise ValueError(f"rid: request id {req.rid!r} is already in use")
        self._validate(req)
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
            r.eos_ids = self.eos_ids
            r.max_total_len = self.context_length
            r.seed = r.params.seed if r.params.seed is not None else self._rng.getrandbits(62)
            if r.params.stop:
                r.stop_checker = StopStringDetokenizer(
                    IncrementalDetokenizer(self.tokenizer, r.params.skip_special_tokens,
                                           r.params.spaces_between_special_tokens, r.prompt_ids),
                    r.params.stop)
            if r.params.grammar is not None:
                r.grammar = self.grammar.matcher(*r.params.grammar)  # GrammarError: a ValueError
        if n > 1:
            self._groups[req.rid] = [r.rid for r in reqs]
            self._parent.update({r.rid: req.rid for r in reqs})
        for r in reqs:
            sched.add(r)
            self._reqs[r.rid] = r
        return [r.rid for r in reqs]

    def _sibling(self, req: Request, i: int) -> Request:
        p = SamplingParams(**{**req.params.to_dict(), "n": 1})
        if p.seed is not None:
            p.seed += i  # distinct but reproducible samples per choice
        return Request(rid=f"{req.rid}-{i}", prompt_ids=list(req.prompt_ids), params=p,
                       priority=req.priority, return_logprob=req.return_logprob,
                       top_logprobs_num=req.top_logprobs_num,
                       logprob_start_len=req.logprob_start_len, stream=req.stream)

    def _validate(self, req: Request) -> None:
        n = len(req.prompt_ids)
        if n == 0:
            raise ValueError("input_ids: the prompt is empty")
        if n >= self.context_length:
            raise ValueError(f"input_ids: the prompt has {n} tokens, the model's context length is "
                             f"{self.context_length}; shorten the prompt")
        if n + 1 > self.pool.capacity * self.page_size:
            raise ValueError(f"input_ids: the prompt has {n} tokens but the KV pool holds "
                             f"{self.pool.capacity * self.page_size}; raise --max-total-tokens")
        bad = [t for t in req.prompt_ids if not 0 <= t < self.arch.vocab_size]
        if bad:
            raise ValueError(f"input_ids: token id {bad[0]} is outside the vocabulary "
                             f"(size {self.arch.vocab_size})")
        p = req.params
        if p.stop and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer, and this engine runs with "
                             "--skip-tokenizer-init; use stop_token_ids")
        if p.grammar is not None and self.grammar is None:
            raise ValueError(f"{p.grammar[0]}: grammar-constrained decoding needs --grammar-backend "
                             f"xgrammar (and a tokenizer)")
        if req.top_logprobs_num < 0 or req.top_logprobs_num > self.arch.vocab_size:
            raise ValueError(f"top_logprobs_num: must be in [0, {self.arch.vocab_size}]")

    def abort(self, rid: str) -> bool:
        """Abort one request, or every choice of an n > 1 request by its original rid."""
        if rid not in self._reqs and rid in self._groups:
            return any([self.abort(r) for r in self._groups.pop(rid)])
        req = self._reqs.get(rid)
        if req is None or req.finished:
            return False
        self.scheduler.abort(rid)
        self._drop_pending(req)
        req.finish({"type": "abort", "message": "aborted by request"})
        self._pending.append(self._output(req))
        self._forget(rid)
        return True

    def _forget(self, rid: str) -> None:
        """Drop a finished request (and its n > 1 group once every choice has ended)."""
        self._reqs.pop(rid, None)
        parent = self._parent.pop(rid, None)
        if parent is not None and parent in self._groups and not any(r in self._reqs for r in self._groups[parent]):
            del self._groups[parent]

    # -- stepping --------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending) or self._inflight is not None

    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        prev, self._inflight = self._inflight, None
        batch = self.scheduler.schedule()
        for req in self.scheduler.oom_finished:
            self._drop_pending(req)
            outputs.append(self._output(req))
            self._forget(req.rid)
        self.scheduler.oom_finished.clear()
        launched = None
        if batch is not None:
            self._account_admissions(batch)
            defer = self.overlap and not any(self._needs_host_tokens(s.req) for s in batch.seqs)
            launched = self.runner.launch(batch, defer)
            if defer:  # placeholders: the next batch reads these ids on the device
                for i, req in enumerate(launched.reqs):
                    req.output_ids.append(-(i + 1))
                    req.num_pending += 1
        if prev is not None:  # its device work ran while this step was scheduled and launched
            outputs += self._complete(prev)
        if launched is not None:
            self.scheduler.update(batch)
            if launched.deferred:
                self._inflight = launched
            else:
                outputs += self._complete(launched)
        return outputs

    @staticmethod
    def _needs_host_tokens(req: Request) -> bool:
        """The request's next step (or this step's result) needs its token values on the host."""
        return (req.grammar is not None or req.params.has_penalties
                or req.params.max_new_tokens == 0 or req.wants_prompt_logprobs)

    def _complete(self, launched: LaunchedStep) -> list[RequestOutput]:
        """Wait for a launched step, apply its tokens and report the requests it ran."""
        finished = self._apply(launched, self.runner.resolve(launched))
        for req, reason in finished:
            self._drop_pending(req)
            self.scheduler.finish(req)
            req.finish(reason)
        outputs = []
        for s in launched.batch.seqs:
            req = s.req
            if req.rid not in self._reqs:
                continue  # ended (and reported) before this step resolved
            if req.finished or len(req.output_ids) - req.num_pending > req.num_sent:
                outputs.append(self._output(req))
            if req.finished:
                self._forget(req.rid)
        return outputs

    @staticmethod
    def _drop_pending(req: Request) -> None:
        """An ending request: forget tokens of steps that were launched after its last one."""
        if req.num_pending:
            del req.output_ids[len(req.output_ids) - req.num_pending:]
            req.num_pending = 0

    def _account_admissions(self, batch: ScheduleBatch) -> None:
        for s in batch.seqs:
            r = s.req
            if not r.counted:
                r.counted = True
                self.counters["prompt_tokens"] += len(r.prompt_ids)
                self.counters["cached_tokens"] += r.cached_tokens

    def _apply(self, launched: LaunchedStep, res: StepResult) -> list[tuple[Request, dict[str, Any]]]:
        """Append sampled tokens (or put them in place of the step's placeholders), record
        logprobs, decide which requests finish (the caller finishes them)."""
        for rid, rows in res.prompt_logprobs.items():
            req = self._reqs[rid]
            for pos, lp, top in rows:
                while len(req.prompt_logprobs) < pos:
                    req.prompt_logprobs.append(None)
                    req.prompt_top_logprobs.append(None)
                req.prompt_logprobs.append(lp)
                req.prompt_top_logprobs.append(top)
        finished = []
        now = time.monotonic()
        for i, (req, tok) in enumerate(res.sampled):
            if req.finished:
                continue  # aborted (or ended) while this step ran
            if req.params.max_new_tokens == 0:  # prefill only (e.g. for prompt logprobs)
                finished.append((req, {"type": "length", "length": 0}))
                continue
            if launched.deferred:
                j = len(req.output_ids) - req.num_pending  # its oldest placeholder is this step's
                assert req.output_ids[j] == -(i + 1), (req.rid, j, req.output_ids[j], i)
                req.output_ids[j] = tok
                req.num_pending -= 1
                n_out = j + 1
            else:
                req.output_ids.append(tok)
                n_out = len(req.output_ids)
            self.counters["generated_tokens"] += 1
            if req.first_token_time is None:
                req.first_token_time = now
            if req.return_logprob:
                req.output_logprobs.append(res.logprobs.get(req.rid, 0.0))
                req.output_top_logprobs.append(res.top_logprobs.get(req.rid, []))
            if req.grammar is not None:
                req.grammar.accept_token(tok)
            reason = self._finish_reason(req, tok, n_out)
            if reason is not None:
                finished.append((req, reason))
        return finished

    def _finish_reason(self, req: Request, tok: int, n_out: int) -> dict[str, Any] | None:
        """Why the request ends with ``tok``, its ``n_out``-th output token (None: it goes on)."""
        p = req.params
        if n_out >= p.min_new_tokens:
            if tok in p.stop_token_ids or (not p.ignore_eos and tok in req.eos_ids):
                return {"type": "stop", "matched": tok}
            if req.grammar is not None and req.grammar.is_terminated():
                return {"type": "stop", "matched": tok}
            if req.stop_checker is not None:
                req.stop_checker.add([tok])
                if req.stop_checker.matched is not None:
                    return {"type": "stop", "matched": req.stop_checker.matched}
        elif req.stop_checker is not None:
            req.stop_checker.add([tok])
        if p.max_new_tokens is not None and n_out >= p.max_new_tokens:
            return {"type": "length", "length": p.max_new_tokens}
        if len(req.prompt_ids) + n_out >= req.max_total_len:
            return {"type": "length", "length": n_out}
        return None

    def _output(self, req: Request) -> RequestOutput:
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
            start = req.logprob_start_len
            lps = req.prompt_logprobs + [None] * (len(req.prompt_ids) - len(req.prompt_logprobs))
            tops = req.prompt_top_logprobs + [None] * (len(req.prompt_ids) - len(req.prompt_top_logprobs))
            out.prompt_logprobs = [(req.prompt_ids[i], lps[i]) for i in range(start, len(req.prompt_ids))]
            out.prompt_top_logprobs = tops[start:] if req.top_logprobs_num else None
        if req.first_token_time is not None:
            out.time_to_first_token = req.first_token_time - req.arrival_time
        if req.finished and req.finish_time is not None:
            out.e2e_latency = req.finish_time - req.arrival_time
        return out

    # -- admin -----------------------------------------------------------------------------------
    def flush_cache(self) -> bool:
        if self.scheduler.running:
            return False
        self.kv.flush()
        return True

    def stats(self) -> EngineStats:
        c = self.counters
        return EngineStats(
            running=len(self.scheduler.running), queued=len(self.scheduler.waiting),
            pages_total=self.pool.capacity, pages_free=self.pool.num_free,
            pages_cached=self.kv.cache.cached_pages, page_size=self.page_size,
            prefix_cache_hit_rate=c["cached_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
            prompt_tokens=c["prompt_tokens"], generated_tokens=c["generated_tokens"],
            cached_tokens=c["cached_tokens"], num_retractions=self.scheduler.num_retractions,
            num_preemptions=self.scheduler.num_preemptions)
