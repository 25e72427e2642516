"""The engine process: runs the EngineCore step loop and streams outputs to the HTTP process.

Loop invariant: incoming messages are drained before every step, so an abort reaches the core at
the latest one step after it was sent; with no work the loop blocks on the socket (50 ms poll).
A watchdog thread kills the process loudly (all thread stacks on stderr, exit code 3) when one
step runs longer than ``--watchdog-timeout``; the HTTP process sees the death and answers 503.

Signals: the engine never dies of SIGINT or SIGTERM (a terminal's Ctrl-C and process managers
signal the whole group). The first one is passed on to the HTTP process as ``Signalled``, which
drains the running requests and then sends ``shutdown``; a second one ends the loop after the
current step. The engine also stops when the HTTP process is gone.

After a step whose outputs were all first tokens, at least one of them a streamed request's, when
the next step only decodes (no prompt waits), the loop pauses for the platform's
``first_token_handoff_s`` (0.5 ms on the CPU, where the forward holds every core) so that the
HTTP process can send them before the next step takes the cores. Not after a step that also
produced other requests' later tokens: those stream every step anyway, and a pause there would
lengthen every running request's inter-token latency.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import zmq
from infer.core.engine import gc_watch
from infer.core.plugins import load_target
from infer.server import ipc

logger = logging.getLogger("infer.engine")

DEFAULT_CORE = "infer.core.engine.engine_core:EngineCore"
_STATS_PERIOD_S = 0.5
_IDLE_POLL_MS = 50


def run_engine_process(server_args: Any, in_addr: str, out_addr: str,
                       core_factory: str = DEFAULT_CORE, dp_rank: int | None = None) -> None:
    """Entry point of the spawned process: build the core, say Ready, then loop until shutdown.
    ``dp_rank``: this engine is data-parallel replica ``dp_rank`` of ``--dp-size``."""
    gc_watch.pause_for_startup()  # until freeze_startup_heap, below
    level = getattr(logging, str(getattr(server_args, "log_level", None) or "info").upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s engine %(levelname)s %(message)s")
    signals = _Signals()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signals.handle)
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(in_addr)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(out_addr)
    try:
        extra = {} if dp_rank is None else {"dp_rank": dp_rank}
        core = load_target(core_factory)(server_args, **extra)
        gc_watch.freeze_startup_heap()
        push.send_pyobj(_ready(core, server_args))
    except BaseException as err:  # noqa: BLE001 - reported to the HTTP process, then re-raised
        push.send_pyobj(ipc.Fatal(f"engine failed to start: {err}\n{traceback.format_exc()}"))
        push.close()
        ctx.term()
        raise
    loop = _EngineLoop(core, pull, push, float(getattr(server_args, "watchdog_timeout", 300) or 0),
                       signals, int(getattr(server_args, "stream_interval", 1) or 1))
    try:
        loop.run()
    except BaseException as err:  # noqa: BLE001
        push.send_pyobj(ipc.Fatal(f"engine crashed: {err}\n{traceback.format_exc()}"))
        raise
    finally:
        getattr(core, "shutdown", lambda: None)()  # other ranks' processes, if any
        push.close()
        pull.close()
        ctx.term()


class _Signals:
    """SIGINT / SIGTERM received by this process, oldest first (the handler only records them)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)


class _EngineLoop:
    def __init__(self, core: Any, pull: zmq.Socket, push: zmq.Socket, watchdog_s: float,
                 signals: _Signals | None = None, stream_interval: int = 1) -> None:
        self.core = core
        self.stream_interval = max(1, stream_interval)  # --stream-interval
        self.pull = pull
        self.push = push
        self.signals = signals or _Signals()
        self.signals_seen = 0
        # the HTTP process; it may have died while the model loaded, when getppid() would
        # already name the reaper that adopted us, so take the pid multiprocessing recorded
        spawned_by = multiprocessing.parent_process()
        self.parent = spawned_by.pid if spawned_by is not None else os.getppid()
        self.step_started: float | None = None  # set while core.step() runs
        self.stopping = False
        self.last_stats = 0.0
        platform = getattr(core, "platform", None)
        self.handoff_s = float(getattr(platform, "first_token_handoff_s", 0.0) or 0.0)
        if watchdog_s > 0:
            threading.Thread(target=self._watchdog, args=(watchdog_s,), daemon=True,
                             name="watchdog").start()

    def run(self) -> None:
        while not self.stopping:
            self._check_signals()
            if self.stopping:
                return
            busy = self.core.has_work()
            if self.pull.poll(0 if busy else _IDLE_POLL_MS):
                self._drain()
            if self.core.has_work():
                self.step_started = time.monotonic()
                outs = self.core.step()
                self.step_started = None
                if outs:
                    wire = [_seq_output(o) for o in outs]
                    self.push.send_pyobj(ipc.Outputs(wire))
                    if self.handoff_s and self._handoff(wire):
                        time.sleep(self.handoff_s)  # the platform's first_token_handoff_s
            now = time.monotonic()
            if now - self.last_stats > _STATS_PERIOD_S:
                self.last_stats = now
                self.push.send_pyobj(ipc.Stats(_stats(self.core)))
                if os.getppid() != self.parent:  # the HTTP process died: nobody to serve
                    logger.error("HTTP process exited; engine stops")
                    return

    def _handoff(self, wire: list[ipc.SeqOutput]) -> bool:
        """Pause before the next step? When this step's outputs were all first tokens, at least
        one of a streamed request (a client waits for it), and the next step is a decode step of
        the running requests with nobody's prompt waiting (queued, part-way through a chunked
        prefill, or unread on the socket): only then does the pause cost no other request's
        first token or inter-token latency."""
        pending = getattr(self.core, "prefill_pending", None)
        streams = getattr(self.core, "streams", None)
        if pending is None or streams is None or not all(map(_first_token, wire)):
            return False
        return (any(streams(o.rid) for o in wire) and self.core.has_work() and not pending()
                and not self.pull.poll(0))

    def _check_signals(self) -> None:
        received = self.signals.received
        if len(received) == self.signals_seen:
            return
        if self.signals_seen == 0:
            name = signal.Signals(received[0]).name
            logger.info("%s: the HTTP server drains the running requests, then stops the engine", name)
            self.push.send_pyobj(ipc.Signalled(received[0]))
        if len(received) > 1:
            logger.warning("%s again: the engine stops now", signal.Signals(received[-1]).name)
            self.stopping = True
        self.signals_seen = len(received)

    def _drain(self) -> None:
        while True:
            try:
                msg = self.pull.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(msg)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, ipc.AddRequest):
            self._add(msg)
        elif isinstance(msg, ipc.AbortRequest):
            self.core.abort(msg.rid)
        elif isinstance(msg, ipc.Control):
            self._control(msg)

    def _add(self, msg: ipc.AddRequest) -> None:
        from infer.core.engine.request import QueueFullError

        try:
            # a streamed request's tokens every --stream-interval; the others' once at the end
            # (and the first at once, for the time to first token)
            every = self.stream_interval if msg.stream else 0
            req = self.core.make_request(
                msg.rid, msg.prompt_ids, msg.params, return_logprob=msg.return_logprob,
                top_logprobs_num=msg.top_logprobs_num, logprob_start_len=msg.logprob_start_len,
                stream=msg.stream, report_every=every)
            self.core.add_request(req)
        except QueueFullError as err:
            self.push.send_pyobj(ipc.Rejected(msg.rid, 503, str(err)))
        except ValueError as err:
            self.push.send_pyobj(ipc.Rejected(msg.rid, 400, str(err)))

    def _control(self, msg: ipc.Control) -> None:
        try:
            if msg.op == "flush_cache":
                payload: Any = self.core.flush_cache()
            elif msg.op == "stats":
                payload = _stats(self.core)
            elif msg.op == "shutdown":
                self.stopping = True
                payload = None
            else:
                raise ValueError(f"unknown control op {msg.op!r}")
            self.push.send_pyobj(ipc.Reply(msg.call_id, True, payload))
        except Exception as err:  # noqa: BLE001 - the caller gets the message
            self.push.send_pyobj(ipc.Reply(msg.call_id, False, str(err)))

    def _watchdog(self, limit_s: float) -> None:
        while True:
            time.sleep(min(1.0, limit_s / 4))
            started = self.step_started
            if started is not None and time.monotonic() - started > limit_s:
                sys.stderr.write(f"\nWATCHDOG: one engine step has run for more than {limit_s:g} s "
                                 "(--watchdog-timeout); the engine is hung. Thread stacks:\n")
                faulthandler.dump_traceback(all_threads=True)
                sys.stderr.flush()
                os._exit(3)


def _ready(core: Any, args: Any) -> ipc.Ready:
    loaded = core.loaded
    eos = getattr(loaded, "eos_token_ids", None) or []
    gen_cfg = getattr(loaded, "generation_config", None) or {}
    return ipc.Ready(
        tokenizer=core.tokenizer,
        chat_template=getattr(loaded, "chat_template", None),
        eos_token_ids=list(eos),
        context_length=int(loaded.arch.context_length),
        generation_config=dict(gen_cfg) if isinstance(gen_cfg, dict) else vars(gen_cfg),
        model_path=str(getattr(args, "model_path", "")),
        stats=_stats(core),
    )


def _stats(core: Any) -> dict[str, Any]:
    stats = core.stats()
    if isinstance(stats, dict):
        return dict(stats)
    out = dict(vars(stats))
    for name in ("token_usage",):  # derived properties travel too
        if hasattr(stats, name):
            out[name] = getattr(stats, name)
    return out


def _first_token(out: ipc.SeqOutput) -> bool:
    """Does this output carry its request's first token (and more are to come)?"""
    return not out.finished and 0 < out.completion_tokens == len(out.new_token_ids)


def _seq_output(out: Any) -> ipc.SeqOutput:
    """Copy an EngineCore RequestOutput into the wire type (only plain Python values cross)."""
    return ipc.SeqOutput(
        rid=out.rid, new_token_ids=list(out.new_token_ids), finished=bool(out.finished),
        finish_reason=out.finish_reason, prompt_tokens=int(out.prompt_tokens),
        completion_tokens=int(out.completion_tokens), cached_tokens=int(out.cached_tokens or 0),
        logprobs=list(out.output_logprobs or []),
        top_logprobs=[list(t) for t in (out.output_top_logprobs or [])],
        prompt_logprobs=out.prompt_logprobs, prompt_top_logprobs=out.prompt_top_logprobs)
