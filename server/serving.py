"""What every generating route shares: server state, sampling params, n sequences, accounting.

``Serving.generate`` takes a tokenized prompt and yields ``SeqDelta``s of all n sequences. It
refuses work while draining or with a dead engine (503), checks the prompt against the context,
counts the request as in flight (SIGTERM waits for these), records metrics and request logs. Any
exit before the end (client gone, error) aborts the sequences still running in the engine.
``Guarded`` (and ``cancel_on_disconnect`` over it) ends a generation as soon as the HTTP client
goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from infer.core.sampling.defaults import sampling_defaults
from infer.core.sampling.params import SamplingParams
from infer.server import ipc
from infer.server.engine_client import EngineClient
from infer.server.errors import bad_request, from_value_error, unavailable
from infer.server.generation import SeqDelta, fit_context, merge, run_sequence
from infer.server.metrics import Metrics
from infer.server.request_limits import PromptEncoder

logger = logging.getLogger("infer.server")


@dataclass
class ServerState:
    args: Any
    client: EngineClient
    tokenizer: Any
    chat_template: str | None
    model_name: str
    context_length: int
    metrics: Metrics | None = None
    draining: bool = False
    in_flight: int = 0
    started: float = field(default_factory=time.time)
    tool_call_parser: str | None = None  # --tool-call-parser, or the one the chat template names
    prompts: PromptEncoder = field(init=False)

    def __post_init__(self) -> None:
        self.prompts = PromptEncoder(self.tokenizer, self.context_length,
                                     bool(getattr(self.args, "allow_auto_truncate", False)))

    def need_tokenizer(self, what: str) -> Any:
        """The tokenizer; without one (--skip-tokenizer-init) a 400 saying that ``what`` needs it."""
        if self.tokenizer is None:
            raise bad_request(f"{what} needs the tokenizer, and this server was started with "
                              f"--skip-tokenizer-init: send token ids to /generate (input_ids) instead")
        return self.tokenizer

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """Defaults under each request's params (--sampling-defaults; the model's by default)."""
        mode = getattr(self.args, "sampling_defaults", None) or "model"
        return sampling_defaults(mode, self.client.ready.generation_config)


@dataclass
class GenerateJob:
    """One request's generation: n sequences sharing a prompt."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    route: str = ""
    prompt_text: str | None = None
    user: str | None = None  # the OpenAI ``user`` field: shown in request logs
    stream: bool = True  # the response streams; False: the engine reports the first token and the end


def make_params(fields: dict[str, Any], defaults: dict[str, Any]) -> SamplingParams:
    """SamplingParams from request fields (None means unset); a bad value is a 400 naming it."""
    try:
        return SamplingParams.from_dict({k: v for k, v in fields.items() if v is not None}, defaults)
    except ValueError as err:
        raise from_value_error(err) from None


class Serving:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def prepare(self, job: GenerateJob) -> None:
        """Check the prompt against the context (or truncate it) and fix the token budget."""
        s = self.state
        if s.draining:
            raise unavailable("the server is shutting down and accepts no new requests")
        if s.client.dead:
            raise unavailable(f"the engine is not running: {s.client.dead}")
        if job.params.stop:
            s.need_tokenizer("a stop string")
        ids, budget = fit_context(job.prompt_ids, job.params.max_new_tokens, s.context_length,
                                  bool(getattr(s.args, "allow_auto_truncate", False)))
        job.prompt_ids = ids
        job.params.max_new_tokens = budget
        job.params.min_new_tokens = min(job.params.min_new_tokens, budget)

    async def generate(self, job: GenerateJob) -> AsyncIterator[SeqDelta]:
        """Run a prepared job (see ``prepare``); deltas of all n sequences, interleaved."""
        s = self.state
        s.in_flight += 1
        started = time.monotonic()
        last: dict[int, float] = {}
        finals: dict[int, SeqDelta] = {}
        outputs: dict[int, list[str]] = {i: [] for i in range(job.n)}
        try:
            streams = [run_sequence(s.client, self._add(job, i), s.tokenizer, i, job.params.stop,
                                    job.params.skip_special_tokens, job.params.no_stop_trim)
                       for i in range(job.n)]
            async for delta in merge(streams):
                now = time.monotonic()
                if s.metrics is not None and delta.token_ids:
                    if delta.index not in last:
                        s.metrics.observe_first_token(now - started)
                    else:
                        s.metrics.observe_tokens(now - last[delta.index], len(delta.token_ids))
                    last[delta.index] = now
                outputs[delta.index].append(delta.text)
                if delta.finish_reason is not None:
                    finals[delta.index] = delta
                yield delta
        finally:
            s.in_flight -= 1
            self._account(job, finals, outputs, time.monotonic() - started)

    def _add(self, job: GenerateJob, i: int) -> ipc.AddRequest:
        params = dataclasses.replace(job.params, n=1, stop=list(job.params.stop))
        if params.seed is not None and i:
            # distinct but reproducible samples per choice, wrapped into the int64 range
            params.seed = (params.seed + i + (1 << 63)) % (1 << 64) - (1 << 63)
        rid = job.rid if job.n == 1 else f"{job.rid}-{i}"
        return ipc.AddRequest(rid, list(job.prompt_ids), params, job.return_logprob,
                              job.top_logprobs_num, job.logprob_start_len, stream=job.stream)

    def _account(self, job: GenerateJob, finals: dict[int, SeqDelta],
                 outputs: dict[int, list[str]], seconds: float) -> None:
        s = self.state
        for i in range(job.n):
            final = finals.get(i)
            reason = final.finish_reason if final else "abort"
            if s.metrics is not None:
                s.metrics.observe_finished(reason or "abort", len(job.prompt_ids),
                                           final.completion_tokens if final else 0,
                                           final.cached_tokens if final else 0, seconds)
        if getattr(s.args, "log_requests", False):
            _log_request(int(getattr(s.args, "log_requests_level", 2)), job, finals, outputs, seconds)


def _log_request(level: int, job: GenerateJob, finals: dict[int, SeqDelta],
                 outputs: dict[int, list[str]], seconds: float) -> None:
    """--log-requests: 0 metadata, 1 + sampling params, 2 + partial input/output, 3 everything."""
    reasons = [finals[i].finish_reason if i in finals else "abort" for i in range(job.n)]
    tokens = [finals[i].completion_tokens if i in finals else 0 for i in range(job.n)]
    parts = [f"request rid={job.rid} route={job.route} user={job.user} prompt_tokens={len(job.prompt_ids)} "
             f"completion_tokens={tokens} finish={reasons} latency={seconds:.3f}s"]
    if level >= 1:
        parts.append(f"params={job.params.to_dict()}")
    if level >= 2:
        cap = None if level >= 3 else 2048
        prompt = job.prompt_text if job.prompt_text is not None else str(job.prompt_ids)
        parts.append(f"input={prompt[:cap]!r}")
        parts.append(f"output={[''.join(o)[:cap] for o in outputs.values()]!r}")
    logger.info(" ".join(parts))


class Guarded:
    """``gen`` stepped by one producer task of its own for its whole life, until it ends or the
    HTTP client disconnects.

    A disconnect (seen by the watcher task) cancels the producer, whose cancellation unwinds
    ``gen`` down to ``EngineClient.stream``, which sends the abort: the engine hears of a gone
    client at once, and no generator is closed while another task is inside it. Items reach the
    route either through a queue (``async for``, ``anext``: one task switch per item) or, after
    ``pump(sink)``, by the producer calling ``sink`` itself: a streamed token then costs no
    queue hand-off and no resumption of the route's task, whose await chain runs through every
    ASGI middleware. The owner calls ``close()`` when done (it cancels both tasks).
    """

    def __init__(self, request: Request, gen: AsyncIterator[Any]) -> None:
        self._items: asyncio.Queue = asyncio.Queue()
        self._sink: Callable[[Any], Awaitable[None]] | None = None
        self._producer = asyncio.create_task(self._produce(gen))
        self._watcher = asyncio.create_task(_watch_disconnect(request, self._producer, self._items))

    async def _produce(self, gen: AsyncIterator[Any]) -> None:
        try:
            async for item in gen:
                if self._sink is None:
                    self._items.put_nowait(item)
                else:
                    await self._sink(item)
            self._items.put_nowait(_END)
        except Exception as err:  # noqa: BLE001 - re-raised in the route; a cancellation passes
            self._items.put_nowait(_Failed(err))

    def __aiter__(self) -> Guarded:
        return self

    async def __anext__(self) -> Any:
        item = await self._items.get()
        if _ended(item) is not None:
            raise StopAsyncIteration
        return item

    async def pump(self, sink: Callable[[Any], Awaitable[None]]) -> bool:
        """Hand every further item to ``await sink(item)``, from the producer task itself once the
        queued items are through; returns when ``gen`` is exhausted (True) or the client went
        away (False), and raises what ``gen`` or ``sink`` raised."""
        while not self._items.empty():
            item = self._items.get_nowait()
            if (end := _ended(item)) is not None:
                return end
            await sink(item)
        self._sink = sink  # the queue is empty: from now on the producer calls sink
        end = _ended(await self._items.get())  # only the end is queued now
        return bool(end)

    def close(self) -> None:
        self._producer.cancel()
        self._watcher.cancel()


def _ended(item: Any) -> bool | None:
    """True at the end of ``gen``, False when the client went away, None for an item; raises
    what the producer caught."""
    if item is _END:
        return True
    if item is _GONE:
        return False
    if isinstance(item, _Failed):
        raise item.error
    return None


async def cancel_on_disconnect(request: Request, gen: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Yield from ``gen`` (run by a ``Guarded``) until it ends or the client disconnects.
    Invariant: when this generator is closed, the producer has been cancelled."""
    guarded = Guarded(request, gen)
    try:
        async for item in guarded:
            yield item
    finally:
        guarded.close()


_END = object()  # the producer's last item: ``gen`` is exhausted
_GONE = object()  # the watcher's: the client disconnected (or the watcher ended otherwise)


@dataclass
class _Failed:
    error: BaseException


async def _watch_disconnect(request: Request, producer: asyncio.Task, items: asyncio.Queue) -> None:
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                break
        if not producer.done():
            logger.info("client disconnected from %s; request aborted", request.url.path)
            producer.cancel()
    finally:
        items.put_nowait(_GONE)
