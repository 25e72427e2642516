"""The offline Engine: ``infer.core.Engine(model_path=..., **flags)`` runs an EngineCore in-process.

Keyword arguments are ServerArgs fields (named like the ``infer serve`` flags). ``generate``
follows SGLang's offline API:

    engine.generate(prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                    logprob_start_len=None, top_logprobs_num=None, stream=False, rid=None,
                    priority=None)
    -> {"text", "output_ids", "meta_info": {"id", "prompt_tokens", "completion_tokens",
        "cached_tokens", "finish_reason", "e2e_latency", [logprob fields]}}
       (a list of those when prompt / input_ids is a list; with n > 1, n entries per prompt)

``stream=True`` returns an iterator of chunks with the same keys (single prompt only). As in
SGLang, each chunk's ``text`` and ``output_ids`` are everything so far; with ``stream_output=True``
(``--stream-output``) they are disjoint segments, only what is new since the previous chunk.
Logprob entries are SGLang's ``(logprob, token_id, None)`` triples. ``async_generate`` is the
awaitable twin (``stream=True`` gives an async iterator). Calls from several threads or tasks
are safe: steps run one at a time under a lock and outputs are routed by request id.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from infer.core.engine.detokenizer import IncrementalDetokenizer, StopStringDetokenizer
from infer.core.engine.engine_core import EngineCore
from infer.core.engine.outputs import RequestOutput
from infer.core.engine.request import Request


class _Track:
    """Per-request accumulation of text, ids and logprobs on the consumer side."""

    def __init__(self, tokenizer: Any, req: Request) -> None:
        p = req.params
        self.detok = None if tokenizer is None else StopStringDetokenizer(
            IncrementalDetokenizer(tokenizer, p.skip_special_tokens, p.spaces_between_special_tokens,
                                   req.prompt_ids), p.stop, p.no_stop_trim)
        self.no_stop_trim = p.no_stop_trim
        self.text, self.ids, self.out_lp, self.out_top = "", [], [], []
        self.meta: dict[str, Any] = {}
        self.finished = False
        self.prompt_lp: Any = None
        self.prompt_top: Any = None
        self.pending: list[RequestOutput] = []  # routed by the pump, not yet fed

    def feed(self, o: RequestOutput) -> tuple[str, list[int]]:
        new = list(o.new_token_ids)
        self.ids.extend(new)
        text_ids = new
        matched = (o.finish_reason or {}).get("matched")
        if o.finished and isinstance(matched, int) and not self.no_stop_trim and new and new[-1] == matched:
            text_ids = new[:-1]  # the matched stop token does not appear in the text
        delta = ""
        if self.detok is not None:
            delta = self.detok.add(text_ids)
            if o.finished:
                delta += self.detok.finish()
        self.text += delta
        self.out_lp.extend(o.output_logprobs)
        self.out_top.extend(o.output_top_logprobs)
        if o.prompt_logprobs is not None:
            self.prompt_lp, self.prompt_top = o.prompt_logprobs, o.prompt_top_logprobs
        self.finished = o.finished
        self.meta = {"id": o.rid, "prompt_tokens": o.prompt_tokens,
                     "completion_tokens": o.completion_tokens, "cached_tokens": o.cached_tokens,
                     "finish_reason": o.finish_reason, "e2e_latency": o.e2e_latency}
        return delta, new

    def meta_info(self, logprob: bool) -> dict[str, Any]:
        meta = dict(self.meta)
        if logprob:
            meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(self.out_lp, self.ids, strict=False)]
            meta["output_top_logprobs"] = [[(lp, t, None) for t, lp in top] for top in self.out_top]
            if self.prompt_lp is not None:
                meta["input_token_logprobs"] = [(lp, t, None) for t, lp in self.prompt_lp]
                meta["input_top_logprobs"] = [None if top is None else [(lp, t, None) for t, lp in top]
                                              for top in (self.prompt_top or [None] * len(self.prompt_lp))]
        return meta


class Engine:
    def __init__(self, model_path: str | None = None, server_args: Any = None, **flags: Any) -> None:
        if server_args is None:
            from infer.core.config import ServerArgs

            if model_path is not None:
                flags["model_path"] = model_path
            server_args = ServerArgs(**flags)
        self.server_args = server_args
        self.core = EngineCore(server_args)
        self.tokenizer = self.core.tokenizer
        self.stream_output = bool(server_args.stream_output)
        self._lock = threading.Lock()
        self._tracks: dict[str, _Track] = {}
        self._counter = itertools.count()
        self._closed = False

    # -- request construction ----------------------------------------------------------------
    def _submit(self, prompt: Any, sampling_params: Any, input_ids: Any, return_logprob: Any,
                logprob_start_len: Any, top_logprobs_num: Any, rid: Any, priority: Any
                ) -> tuple[list[list[str]], bool]:
        if self._closed:
            raise RuntimeError("the engine was shut down")
        if (prompt is None) == (input_ids is None):
            raise ValueError("prompt: give exactly one of prompt and input_ids")
        batched = isinstance(prompt, list) if prompt is not None else \
            bool(input_ids) and isinstance(input_ids[0], list)
        if prompt is not None:
            prompts = prompt if batched else [prompt]
            if self.tokenizer is None:
                raise ValueError("prompt: the engine has no tokenizer (--skip-tokenizer-init); pass input_ids")
            ids_list = [self.tokenizer.encode(p) for p in prompts]
        else:
            ids_list = input_ids if batched else [input_ids]
        n = len(ids_list)

        def per(x: Any, name: str) -> list[Any]:
            if isinstance(x, list) and batched:
                if len(x) != n:
                    raise ValueError(f"{name}: a list of {len(x)} for {n} prompts")
                return x
            return [x] * n

        sps = per(sampling_params, "sampling_params")
        lps, starts, tops = per(return_logprob, "return_logprob"), per(logprob_start_len, "logprob_start_len"), \
            per(top_logprobs_num, "top_logprobs_num")
        rids = per(rid, "rid") if rid is not None else [uuid.uuid4().hex for _ in range(n)]
        prios = per(priority, "priority")
        groups: list[list[str]] = []
        with self._lock:
            try:
                self._add_all(groups, n, rids, ids_list, sps, prios, lps, tops, starts)
            except Exception:  # all or nothing: withdraw what was already queued
                for g in groups:
                    for r in g:
                        self.core.abort(r)
                        self._tracks.pop(r, None)
                raise
        return groups, batched

    def _add_all(self, groups: list[list[str]], n: int, rids: list[Any], ids_list: list[Any],
                 sps: list[Any], prios: list[Any], lps: list[Any], tops: list[Any],
                 starts: list[Any]) -> None:
        for i in range(n):
            want = bool(lps[i])
            req = self.core.make_request(
                rids[i], ids_list[i], sps[i], priority=prios[i] or 0, return_logprob=want,
                top_logprobs_num=int(tops[i] or 0),
                logprob_start_len=(-1 if not want else (starts[i] if starts[i] is not None else -1)))
            added = self.core.add_request(req)
            for r in added:
                self._tracks[r] = _Track(self.tokenizer, self.core.table.reqs[r])
            groups.append(added)

    def _pump(self) -> None:
        with self._lock:
            for o in self.core.step():
                tr = self._tracks.get(o.rid)
                if tr is not None:
                    tr.pending.append(o)

    def _drain(self, rid: str) -> list[RequestOutput]:
        tr = self._tracks[rid]
        out, tr.pending = tr.pending, []
        return out

    def _result(self, rid: str, logprob: bool) -> dict[str, Any]:
        tr = self._tracks.pop(rid)
        return {"text": tr.text, "output_ids": tr.ids, "meta_info": tr.meta_info(logprob)}

    # -- public API ------------------------------------------------------------------------------
    def generate(self, prompt: Any = None, sampling_params: Any = None, input_ids: Any = None,
                 return_logprob: Any = False, logprob_start_len: Any = None,
                 top_logprobs_num: Any = None, stream: bool = False, rid: Any = None,
                 priority: Any = None, **unsupported: Any) -> Any:
        if unsupported:
            raise ValueError(f"{sorted(unsupported)[0]}: not supported by infer's Engine.generate")
        groups, batched = self._submit(prompt, sampling_params, input_ids, return_logprob,
                                       logprob_start_len, top_logprobs_num, rid, priority)
        if stream:
            return self._stream(self._stream_rid(groups, batched), bool(return_logprob))
        rids = [r for g in groups for r in g]
        while not self._finished(rids):
            self._pump()
            self._feed(rids)
        return self._results(rids, batched, bool(return_logprob))

    def _stream(self, rid: str, logprob: bool) -> Iterator[dict[str, Any]]:
        try:
            while True:
                self._pump()
                chunks, done = self._stream_chunks(rid, logprob)
                yield from chunks
                if done:
                    return
        finally:
            self._close_stream(rid)

    async def async_generate(self, prompt: Any = None, sampling_params: Any = None,
                             input_ids: Any = None, return_logprob: Any = False,
                             logprob_start_len: Any = None, top_logprobs_num: Any = None,
                             stream: bool = False, rid: Any = None, priority: Any = None) -> Any:
        groups, batched = self._submit(prompt, sampling_params, input_ids, return_logprob,
                                       logprob_start_len, top_logprobs_num, rid, priority)
        if stream:
            return self._astream(self._stream_rid(groups, batched), bool(return_logprob))
        rids = [r for g in groups for r in g]
        while not self._finished(rids):
            await asyncio.to_thread(self._pump)
            self._feed(rids)
        return self._results(rids, batched, bool(return_logprob))

    async def _astream(self, rid: str, logprob: bool) -> AsyncIterator[dict[str, Any]]:
        try:
            while True:
                await asyncio.to_thread(self._pump)
                chunks, done = self._stream_chunks(rid, logprob)
                for chunk in chunks:
                    yield chunk
                if done:
                    return
        finally:
            self._close_stream(rid)

    # -- shared by the sync and async paths (they differ only in how they wait for a step) ---------
    @staticmethod
    def _stream_rid(groups: list[list[str]], batched: bool) -> str:
        if batched or len(groups[0]) != 1:
            raise ValueError("stream: streaming takes one prompt with n = 1")
        return groups[0][0]

    def _finished(self, rids: list[str]) -> bool:
        return all(self._tracks[r].finished for r in rids)

    def _feed(self, rids: list[str]) -> None:
        for r in rids:
            for o in self._drain(r):
                self._tracks[r].feed(o)

    def _results(self, rids: list[str], batched: bool, logprob: bool) -> Any:
        results = [self._result(r, logprob) for r in rids]
        return results if batched or len(results) > 1 else results[0]

    def _stream_chunks(self, rid: str, logprob: bool) -> tuple[list[dict[str, Any]], bool]:
        """The chunks of the outputs that arrived for ``rid``, and whether it has finished."""
        chunks = []
        for o in self._drain(rid):
            chunks.append(self._chunk(self._tracks[rid], o, logprob))
            if o.finished:
                return chunks, True
        return chunks, False

    def _close_stream(self, rid: str) -> None:
        """A stream ended (finished, or its consumer stopped early): abort what still runs."""
        if rid in self._tracks:
            if not self._tracks[rid].finished:
                self.abort(rid)
            self._tracks.pop(rid, None)

    def _chunk(self, tr: _Track, o: RequestOutput, logprob: bool) -> dict[str, Any]:
        delta, new = tr.feed(o)
        if self.stream_output:
            return {"text": delta, "output_ids": new, "meta_info": tr.meta_info(logprob)}
        return {"text": tr.text, "output_ids": list(tr.ids), "meta_info": tr.meta_info(logprob)}

    def abort(self, rid: str) -> bool:
        with self._lock:
            return self.core.abort(rid)

    def flush_cache(self) -> bool:
        with self._lock:
            return self.core.flush_cache()

    def get_stats(self) -> Any:
        with self._lock:
            return self.core.stats()

    def shutdown(self) -> None:
        with self._lock:
            for rid in list(self.core.table.reqs):
                self.core.abort(rid)
            while self.core.has_work():
                self.core.step()
            self._tracks.clear()
            self._closed = True
            self.core.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
