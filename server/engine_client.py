"""The HTTP process's handle on the engine process: send requests, route outputs to streams.

One listener task reads every message the engine sends and puts each ``SeqOutput`` on the queue
of its request; a monitor task notices when the engine process dies. Invariants: a request's queue
exists from ``stream()`` until its last output (or its abort); when the engine is dead every open
stream ends with a 503 and new ones are refused at once, and a send that the dead engine will never
take (a PUSH socket without a peer blocks) gives up, so no caller ever waits forever.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import zmq
import zmq.asyncio
from infer.server import ipc
from infer.server.errors import APIError, unavailable

logger = logging.getLogger("infer.server")

_DEAD = object()  # queue sentinel: the engine died


class EngineClient:
    def __init__(self, proc: Any, pull: zmq.asyncio.Socket, push: zmq.asyncio.Socket,
                 ready: ipc.Ready) -> None:
        self.proc = proc
        self.pull = pull
        self.push = push
        self.ready = ready
        self.stats: dict[str, Any] = dict(ready.stats)
        self.dead: str | None = None  # why the engine is gone
        self.on_death: Callable[[str], None] | None = None
        self.on_signal: Callable[[int], None] | None = None  # the engine process got SIGINT/SIGTERM
        self._death: asyncio.Future | None = None  # done once the engine is dead
        self._streams: dict[str, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._death = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._monitor())]

    @property
    def num_open(self) -> int:
        return len(self._streams)

    async def stream(self, req: ipc.AddRequest) -> AsyncIterator[ipc.SeqOutput]:
        """Yield the request's outputs until it finishes; leaving early aborts it in the engine."""
        if self.dead:
            raise unavailable(f"the engine is not running: {self.dead}")
        if req.rid in self._streams:
            raise APIError(400, f"a request with rid {req.rid!r} is already running", param="rid")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[req.rid] = queue
        finished = False
        try:
            await self._send(req)
            while True:
                item = await queue.get()
                if item is _DEAD:
                    raise unavailable(f"the engine stopped while serving this request: {self.dead}")
                if isinstance(item, ipc.Rejected):
                    finished = True
                    raise _rejection(item)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(req.rid, None)
            if not finished and not self.dead:
                await self.abort(req.rid)

    def rids_of(self, rid: str) -> list[str]:
        """Engine rids of a running request: ``rid`` itself, or ``rid-<i>`` for its n choices."""
        return [r for r in self._streams
                if r == rid or (r.startswith(rid + "-") and r[len(rid) + 1:].isdigit())]

    async def abort(self, rid: str | None) -> None:
        if not self.dead and not self.push.closed:  # closed: the server is past its shutdown
            await self._send(ipc.AbortRequest(rid))

    async def _send(self, msg: Any) -> None:
        """Send to the engine, or raise 503 as soon as it is known to be dead."""
        if self._death is None:
            await self.push.send_pyobj(msg)
            return
        send = asyncio.ensure_future(self.push.send_pyobj(msg))
        await asyncio.wait({send, self._death}, return_when=asyncio.FIRST_COMPLETED)
        if not send.done():
            send.cancel()
            raise unavailable(f"the engine is not running: {self.dead}")
        send.result()

    async def call(self, op: str, timeout: float = 30.0) -> Any:
        """Run a control op in the engine (``flush_cache``, ``stats``, ``shutdown``)."""
        if self.dead:
            raise unavailable(f"the engine is not running: {self.dead}")
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        try:
            ok, payload = await asyncio.wait_for(self._call(ipc.Control(call_id, op), fut), timeout)
        except asyncio.TimeoutError:
            raise unavailable(f"the engine did not answer {op!r} within {timeout:g} s") from None
        finally:
            self._calls.pop(call_id, None)
        if not ok:
            raise APIError(500, f"{op} failed in the engine: {payload}")
        return payload

    async def _call(self, msg: ipc.Control, reply: asyncio.Future) -> Any:
        await self._send(msg)
        return await reply

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- background tasks -----------------------------------------------------------------
    async def _listen(self) -> None:
        while True:
            msg = await self.pull.recv_pyobj()
            if isinstance(msg, ipc.Outputs):
                for out in msg.outputs:
                    queue = self._streams.get(out.rid)
                    if queue is not None:
                        queue.put_nowait(out)
            elif isinstance(msg, ipc.Stats):
                self.stats = msg.stats
            elif isinstance(msg, ipc.Rejected):
                queue = self._streams.get(msg.rid)
                if queue is not None:
                    queue.put_nowait(msg)
            elif isinstance(msg, ipc.Reply):
                fut = self._calls.get(msg.call_id)
                if fut is not None and not fut.done():
                    fut.set_result((msg.ok, msg.payload))
            elif isinstance(msg, ipc.Signalled):
                if self.on_signal is not None:
                    self.on_signal(msg.signum)
            elif isinstance(msg, ipc.Fatal):
                logger.error("%s", msg.message)
                self._die(msg.message.splitlines()[0])

    async def _monitor(self) -> None:
        while self.dead is None:
            await asyncio.sleep(0.2)
            if not self.proc.is_alive():
                await asyncio.sleep(0.2)  # let a Fatal message that is in flight land first
                self._die(f"engine process exited with code {self.proc.exitcode}")

    def _die(self, why: str) -> None:
        if self.dead is not None:
            return
        self.dead = why
        if self._death is not None and not self._death.done():
            self._death.set_result(why)
        logger.error("engine is dead: %s", why)
        for queue in self._streams.values():
            queue.put_nowait(_DEAD)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_result((False, why))
        if self.on_death is not None:
            self.on_death(why)


def _rejection(msg: ipc.Rejected) -> APIError:
    if msg.status == 503:
        return unavailable(f"the server is busy: {msg.message}; retry later", retry_after=1)
    return APIError(msg.status, msg.message)
