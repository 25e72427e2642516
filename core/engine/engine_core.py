"""EngineCore: the stepping core of infer. The server's engine process and the offline Engine
both drive one of these; it is single-threaded and never blocks on anything but the model.

API (all plain Python values; Request / RequestOutput / EngineStats pickle):
    core = EngineCore(server_args)          # gate, load, size the pool (infer.core.engine.builder)
    core.tokenizer, core.loaded             # HF tokenizer, LoadedModel (arch, generation_config, ...)
    core.make_request(rid, input_ids, sampling_params, ...) -> Request    (engine.admission)
    core.add_request(req) -> list[str]      # rids added (n > 1 expands to "<rid>-0" ..); raises
                                            # QueueFullError or ValueError (bad params, too long)
    core.abort(rid) -> bool                 # queued or running; its pages are freed; reported once
                                            # by the next step() with finish_reason type "abort"
    core.step() -> list[RequestOutput]      # one scheduling step + forward; increments per request
                                            # (each request's as its report_every says)
    core.has_work() -> bool                 # queued/running requests, a step in flight, or reports
    core.flush_cache() -> bool              # drops the prefix cache (False while requests run)
    core.stats() -> EngineStats

Overlap scheduling (SGLang's; on unless --disable-overlap-schedule, off by default where the
forward runs on the host thread): ``step()`` schedules and launches batch N+1 while batch N still
runs on the device, and only then waits for N's sampled ids and reports them. Batch N+1 reads N's
tokens on the device (placeholders ``-(row + 1)`` in ``output_ids``, see engine.request). Outputs
equal the plain order's; a request that stops on a sampled token computes one extra row that is
discarded. A batch with a request whose next step needs token values on the host (grammar,
penalties, prompt logprobs, max_new_tokens 0) is resolved at once.

Sampled tokens are applied, and finish reasons decided, by ``infer.core.engine.finish``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from infer.core.config.views import EngineConfig
from infer.core.engine import gc_watch
from infer.core.engine.builder import build_engine
from infer.core.engine.finish import apply_step
from infer.core.engine.model_runner import LaunchedStep
from infer.core.engine.outputs import EngineStats, RequestOutput, engine_stats, make_output
from infer.core.engine.request import QueueFullError, Request

__all__ = ["EngineCore", "QueueFullError", "Request", "RequestOutput", "EngineStats"]


class EngineCore:
    def __init__(self, server_args: Any, platform: Any = None, loaded: Any = None,
                 dp_rank: int = 0) -> None:
        if platform is None:
            from infer.core.config.gate import run_gate

            platform = run_gate(server_args).platform
        cfg = EngineConfig.from_server_args(server_args)
        gc_watch.install_warning(cfg.gc_warning_threshold_secs, "engine")
        if dp_rank:
            cfg = replace(cfg, parallel=replace(cfg.parallel, dp_rank=dp_rank))
        parts = build_engine(cfg, platform, loaded)
        self.args, self.cfg, self.platform, self.loaded = server_args, parts.cfg, platform, parts.loaded
        self.tokenizer, self.arch = parts.loaded.tokenizer, parts.loaded.arch
        self.pool, self.kv, self.scheduler = parts.pool, parts.kv, parts.scheduler
        self.executor, self.grammar = parts.executor, parts.grammar
        self.table, self.admission = parts.table, parts.admission
        self.page_size, self.context_length = self.pool.page_size, self.arch.context_length
        self.make_request = self.admission.make_request
        self.overlap = parts.cfg.overlap_schedule
        self._pending: list[RequestOutput] = []  # aborts / errors to report in the next step
        self._inflight: LaunchedStep | None = None  # launched, sampled ids not yet on the host
        self.counters = {"prompt_tokens": 0, "generated_tokens": 0, "cached_tokens": 0}

    @property
    def runner(self) -> Any:
        """The model runner of a one-process executor (tests and benchmarks look inside it)."""
        return self.executor.runner

    def add_request(self, req: Request) -> list[str]:
        return self.admission.add(req)

    def abort(self, rid: str) -> bool:
        """Abort one request, or every choice of an n > 1 request by its original rid."""
        t = self.table
        if rid not in t.reqs and rid in t.groups:
            return any([self.abort(r) for r in t.groups.pop(rid)])
        req = t.reqs.get(rid)
        if req is None or req.finished:
            return False
        self.scheduler.abort(rid)
        self._drop_pending(req)
        req.finish({"type": "abort", "message": "aborted by request"})
        self._pending.append(make_output(req))
        self._forget(req)
        return True

    def _forget(self, req: Request) -> None:
        self.table.forget(req.rid)
        self.executor.forget(req.rid)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending) or self._inflight is not None

    def prefill_pending(self) -> bool:
        """Some request still has prompt tokens to run (waiting, or a chunked prefill)."""
        return self.scheduler.prefill_pending()

    def streams(self, rid: str) -> bool:
        """Is ``rid`` a live request (an engine rid: ``rid-<i>`` for a choice of n > 1) whose
        client streams its tokens?"""
        req = self.table.reqs.get(rid)
        return req is not None and req.stream

    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        prev, self._inflight = self._inflight, None
        batch = self.scheduler.schedule()
        for req in self.scheduler.oom_finished:
            self._drop_pending(req)
            outputs.append(make_output(req))
            self._forget(req)
        self.scheduler.oom_finished.clear()
        launched = None
        if batch is not None:
            self._account_admissions(batch)
            defer = self.overlap and not any(self._needs_host_tokens(s.req) for s in batch.seqs)
            launched = self.executor.launch(batch, defer)
            if launched.deferred:  # placeholders: the next batch reads these ids on the device
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
        finished = apply_step(launched, self.executor.resolve(launched), self.table.reqs, self.counters)
        for req, reason in finished:
            self._drop_pending(req)
            self.scheduler.finish(req)
            req.finish(reason)
        outputs = []
        for s in launched.batch.seqs:
            req = s.req
            if req.rid not in self.table.reqs:
                continue  # ended (and reported) before this step resolved
            if req.finished or self._due(req):
                outputs.append(make_output(req))
            if req.finished:
                self._forget(req)
        return outputs

    @staticmethod
    def _due(req: Request) -> bool:
        """Whether a running request's new tokens are reported now: the first token at once
        (the time to first token does not wait), later ones once ``req.report_every`` of them
        are unreported (0: not before the end)."""
        new = len(req.output_ids) - req.num_pending - req.num_sent
        if new <= 0:
            return False
        return req.num_sent == 0 or 0 < req.report_every <= new

    @staticmethod
    def _drop_pending(req: Request) -> None:
        """An ending request: forget tokens of steps that were launched after its last one."""
        if req.num_pending:
            del req.output_ids[len(req.output_ids) - req.num_pending:]
            req.num_pending = 0

    def _account_admissions(self, batch: Any) -> None:
        for s in batch.seqs:
            r = s.req
            if not r.counted:
                r.counted = True
                self.counters["prompt_tokens"] += len(r.prompt_ids)
                self.counters["cached_tokens"] += r.cached_tokens

    def shutdown(self) -> None:
        """Stop the executor (and the processes of other ranks); the core is unusable after."""
        self.executor.shutdown()

    def flush_cache(self) -> bool:
        if self.scheduler.running:
            return False
        self.kv.flush()
        return True

    def stats(self) -> EngineStats:
        return engine_stats(self.scheduler, self.pool, self.kv.cache, self.counters)
