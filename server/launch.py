"""``launch_server``: start the engine process, serve HTTP, warm up, drain on SIGTERM.

Process layout: this (HTTP) process binds two ZMQ ipc sockets and spawns the engine process,
which builds the EngineCore and connects. The HTTP side owns tokenisation, chat templates and
detokenisation, so its event loop never waits on a forward pass.

Signals: SIGINT or SIGTERM, to this process, to the engine process or to the whole group (a
terminal's Ctrl-C), starts a drain: new requests get 503, running ones finish (at most
``DRAIN_TIMEOUT_S``), then the engine is shut down and the server exits. A second signal to this
process stops at once, a third forces the exit.

Exit codes: 0 after a clean shutdown (a drain, or a second signal), 1 when the engine died or
failed to start or warm up, 2 for a bad server option.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any

import httpx
import uvicorn
import zmq
import zmq.asyncio
from infer.core.engine import gc_watch
from infer.server import ipc
from infer.server.app import build_app
from infer.server.chat import resolve_chat_template
from infer.server.engine_client import EngineClient
from infer.server.engine_proc import DEFAULT_CORE, run_engine_process
from infer.server.metrics import Metrics
from infer.server.reasoning import check_parser
from infer.server.replicas import ReplicaSet
from infer.server.request_limits import max_request_bytes
from infer.server.serving import ServerState
from infer.server.tool_parsers import detect_parser, get_parser

logger = logging.getLogger("infer.server")

DRAIN_TIMEOUT_S = 60.0  # SIGTERM: the longest running requests may take to finish
_ENGINE_STOP_S = 10.0


class StartupError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def launch_server(args: Any, *, core_factory: str = DEFAULT_CORE) -> int:
    """Serve until shut down; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        _check_options(args)
        gc_watch.install_warning(float(getattr(args, "gc_warning_threshold_secs", 0) or 0), "HTTP")
        return _run_loop(_serve(args, core_factory))
    except StartupError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return err.code


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop for the HTTP process where it is installed (a dependency on Linux and
    macOS; SGLang's server runs on it too), else asyncio's own (None).

    Each streamed token costs the HTTP process CPU that, on a small machine, it takes from the
    engine's compute threads. 64 requests at 32 clients on the bf16 server, 2 cores, CPU time of
    the HTTP process per streamed token, alternating: 97-102 us on asyncio's loop with h11,
    85-92 us on uvloop with httptools (which uvicorn takes when it is installed).
    """
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    factory = event_loop_factory()
    if factory is None:
        return asyncio.run(main)
    if sys.version_info < (3, 11):  # no asyncio.Runner: the policy picks the loop
        asyncio.set_event_loop_policy(type("UvloopPolicy", (asyncio.DefaultEventLoopPolicy,),
                                           {"new_event_loop": lambda self: factory()})())
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def _check_options(args: Any) -> None:
    try:
        if getattr(args, "tool_call_parser", None):
            get_parser(args.tool_call_parser)
        if getattr(args, "reasoning_parser", None):
            check_parser(args.reasoning_parser)
        if getattr(args, "chat_template", None):
            resolve_chat_template(args.chat_template, None)
        max_request_bytes()
    except ValueError as err:
        raise StartupError(str(err), 2) from None
    if getattr(args, "is_embedding", False):
        raise StartupError("--is-embedding: embedding models are not implemented by infer", 2)


async def _serve(args: Any, core_factory: str) -> int:
    """Start the engine process(es): one, or one per data-parallel replica (``--dp-size``)."""
    ipc_dir = tempfile.mkdtemp(prefix="infer-ipc-")
    ctx = zmq.asyncio.Context()
    dp = int(getattr(args, "dp_size", 1) or 1)
    engines = [_spawn_engine(ctx, ipc_dir, args, core_factory, i, dp) for i in range(dp)]
    clients: list[EngineClient] = []
    client: Any = None
    try:
        for proc, push, pull in engines:
            clients.append(EngineClient(proc, pull, push, await _wait_ready(pull, proc)))
        client = clients[0] if dp == 1 else ReplicaSet(clients, _balance_method(args))
        client.start()
        return await _run_http(args, client)
    finally:
        for c in clients:
            if client is not None:
                await _stop_engine(c)
                await c.close()
        for proc, push, pull in engines:
            if proc.is_alive():  # the engine outlives SIGTERM (see engine_proc): only a kill ends it
                proc.kill()
                proc.join()
            push.close()
            pull.close()
        ctx.term()
        shutil.rmtree(ipc_dir, ignore_errors=True)


def _spawn_engine(ctx: zmq.asyncio.Context, ipc_dir: str, args: Any, core_factory: str,
                  dp_rank: int, dp_size: int) -> tuple[Any, zmq.asyncio.Socket, zmq.asyncio.Socket]:
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.setsockopt(zmq.LINGER, 0)
    to_engine = f"ipc://{ipc_dir}/to_engine{dp_rank}"
    from_engine = f"ipc://{ipc_dir}/from_engine{dp_rank}"
    push.bind(to_engine)
    pull.bind(from_engine)
    extra = (dp_rank,) if dp_size > 1 else ()
    proc = multiprocessing.get_context("spawn").Process(
        target=run_engine_process, args=(args, to_engine, from_engine, core_factory, *extra),
        name="infer-engine" if dp_size == 1 else f"infer-engine-dp{dp_rank}", daemon=True)
    proc.start()
    return proc, push, pull


def _balance_method(args: Any) -> str:
    return getattr(args, "load_balance_method", None) or "auto"


async def _wait_ready(pull: zmq.asyncio.Socket, proc: Any) -> ipc.Ready:
    while True:
        if await pull.poll(200):
            msg = await pull.recv_pyobj()
            if isinstance(msg, ipc.Ready):
                return msg
            if isinstance(msg, ipc.Fatal):
                raise StartupError(msg.message, 1)
        elif not proc.is_alive():
            raise StartupError(f"the engine process exited with code {proc.exitcode} while starting", 1)


async def _stop_engine(client: EngineClient) -> None:
    if client.dead:
        return
    try:
        await client.call("shutdown", timeout=_ENGINE_STOP_S)
    except Exception as err:  # noqa: BLE001 - the process is terminated next anyway
        logger.warning("engine did not stop cleanly: %s", err)
    client.proc.join(_ENGINE_STOP_S)


async def _run_http(args: Any, client: EngineClient) -> int:
    ready = client.ready
    model_name = getattr(args, "served_model_name", None) or str(getattr(args, "model_path", "model"))
    template = resolve_chat_template(getattr(args, "chat_template", None), ready.chat_template)
    state = ServerState(
        args=args, client=client, tokenizer=ready.tokenizer, chat_template=template,
        model_name=model_name, context_length=ready.context_length,
        metrics=Metrics(model_name, args) if getattr(args, "enable_metrics", False) else None,
        tool_call_parser=_tool_call_parser(args, template))
    host, port = getattr(args, "host", "127.0.0.1"), int(getattr(args, "port", 30000))
    config = uvicorn.Config(build_app(state), host=host, port=port, lifespan="off",
                            log_level=_http_log_level(args),
                            timeout_graceful_shutdown=5, access_log=False)
    server = _Server(config, state)
    client.on_death = server.engine_died
    client.on_signal = server.engine_signalled
    tasks = [asyncio.create_task(server.drain_watch()),
             asyncio.create_task(_announce(server, args, f"http://{host}:{port}"))]
    try:
        await server.serve()
    except SystemExit as err:  # uvicorn exits this way when it cannot bind
        raise StartupError(f"cannot serve on {host}:{port}", 1) from err
    finally:
        for t in tasks:
            t.cancel()
    return server.exit_code


def _tool_call_parser(args: Any, template: str | None) -> str | None:
    """--tool-call-parser, else the parser the chat template names unambiguously (logged)."""
    chosen = getattr(args, "tool_call_parser", None)
    if chosen:
        return chosen
    detected = detect_parser(template)
    if detected is not None:
        logger.info("default: --tool-call-parser %s (the chat template uses its tool-call format); "
                    "set --tool-call-parser to choose another", detected)
    return detected


def _http_log_level(args: Any) -> str:
    """--log-level-http (alias --uvicorn-log-level); by default uvicorn only warns, so the one
    ready line is the only line that announces the URL."""
    return str(getattr(args, "log_level_http", None) or "warning").lower()


class _Server(uvicorn.Server):
    """uvicorn with a draining SIGINT / SIGTERM: refuse new requests, let running ones finish, exit."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.exit_code = 0
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is None and not self.should_exit:
            self._start_drain(f"{signal.Signals(sig).name}")
            return
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    def engine_signalled(self, sig: int) -> None:
        """The engine process got ``sig``: drain as for a signal here, but never escalate (with a
        group signal this process got the same signal already)."""
        if self.drain_deadline is None and not self.should_exit:
            self._start_drain(f"{signal.Signals(sig).name} to the engine process")

    def _start_drain(self, why: str) -> None:
        self.state.draining = True
        self.drain_deadline = time.monotonic() + DRAIN_TIMEOUT_S
        logger.warning("%s: draining %d running request(s) (at most %.0f s; signal again to stop at "
                       "once); new requests get 503", why, self.state.in_flight, DRAIN_TIMEOUT_S)

    def engine_died(self, why: str) -> None:
        self.exit_code = 1
        self.state.draining = True
        self.should_exit = True

    async def drain_watch(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            if self.drain_deadline is not None and not self.should_exit:
                if self.state.in_flight == 0 or time.monotonic() > self.drain_deadline:
                    logger.warning("drained (%d request(s) still running); shutting down",
                                   self.state.in_flight)
                    self.should_exit = True


async def _announce(server: _Server, args: Any, url: str) -> None:
    """Wait for the socket, warm up through HTTP, then print the one ready line."""
    while not server.started:
        await asyncio.sleep(0.05)
    if not getattr(args, "skip_server_warmup", False):
        key = getattr(args, "api_key", None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        prompt: dict[str, Any] = {"text": "The capital of France is"} if server.state.tokenizer \
            is not None else {"input_ids": [1, 2, 3, 4]}  # --skip-tokenizer-init: ids only
        body = {**prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        try:
            async with httpx.AsyncClient(timeout=600) as http:
                resp = await http.post(f"{url}/generate", json=body, headers=headers)
            resp.raise_for_status()
        except Exception as err:  # noqa: BLE001 - a failed warm-up stops the server
            logger.error("warm-up request failed: %s", err)
            server.exit_code = 1
            server.should_exit = True
            return
    gc_watch.freeze_startup_heap()  # after the warm-up: what serving keeps from here on
    print(f"infer server is ready at {url} (model {server.state.model_name!r})", flush=True)


if __name__ == "__main__":  # `python -m infer.server.launch ...` is `infer serve ...`
    from infer.launch_server import main

    main()
