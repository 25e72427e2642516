"""--watchdog-timeout: a step that hangs kills the engine process loudly (exit code 3)."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

import zmq
from infer.server import ipc
from infer.server.engine_proc import run_engine_process


def test_hung_step_crashes_engine_loudly(tmp_path, capfd, monkeypatch):
    here = str(Path(__file__).parent)  # the spawned process imports slow_core from here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    to_engine, from_engine = f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out"
    push.bind(to_engine)
    pull.bind(from_engine)
    proc = multiprocessing.get_context("spawn").Process(
        target=run_engine_process,
        args=(SimpleNamespace(watchdog_timeout=1.0), to_engine, from_engine, "slow_core:HangingCore"))
    proc.start()
    try:
        assert pull.poll(60_000), "engine never said Ready"
        assert isinstance(pull.recv_pyobj(), ipc.Ready)
        push.send_pyobj(ipc.AddRequest("r", [1, 2], None))
        t0 = time.monotonic()
        proc.join(30)
        assert proc.exitcode == 3
        assert time.monotonic() - t0 < 30
    finally:
        if proc.is_alive():
            proc.kill()
        push.close(0)
        pull.close(0)
        ctx.term()
    assert "WATCHDOG" in capfd.readouterr().err
