"""An `infer serve` subprocess on 127.0.0.1 for the server tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

READY_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    """An `infer serve` subprocess; its output goes to a log file shown when something fails."""

    def __init__(self, model_dir: Path, log_dir: Path, *flags: str, own_group: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{self.port}.log"
        infer = shutil.which("infer") or "infer"
        cmd = [infer, "serve", "--model-path", str(model_dir), "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", *flags]
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # own_group: a process group of its own, which a test may signal as a whole (as a terminal's
        # Ctrl-C or a process manager does) without signalling pytest
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=own_group)

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self) -> ServerProc:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if "infer server is ready at" in self.output():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready in {READY_TIMEOUT_S} s:\n{self.output()[-4000:]}")

    def engine_pid(self) -> int:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        for pid in pids:  # the spawned engine process runs multiprocessing's spawn_main
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                return pid
        raise RuntimeError(f"no engine process among children {pids}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def engine_stats(http) -> dict:
    """The engine's counters (running, queued, pages, tokens) from /get_server_info."""
    return http.get("/get_server_info").json()["engine"]


def wait_engine_idle(http, timeout: float = 60) -> dict:
    """Poll until nothing runs or waits in the engine; its stats then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        eng = engine_stats(http)
        if eng["running"] == 0 and eng["queued"] == 0:
            return eng
        time.sleep(0.05)
    raise AssertionError(f"engine still busy after {timeout} s: {eng}")
