"""Fixtures: a tiny random Llama on disk and real `infer serve` processes on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_model import make_tiny_llama  # noqa: E402

READY_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    """An `infer serve` subprocess; its output goes to a log file shown when something fails."""

    def __init__(self, model_dir: Path, log_dir: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{self.port}.log"
        infer = shutil.which("infer") or "infer"
        cmd = [infer, "serve", "--model-path", str(model_dir), "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", *flags]
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

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


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(d)
    return d


@pytest.fixture(scope="session")
def start_server(tiny_dir, tmp_path_factory):
    started: list[ServerProc] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(*flags: str, wait: bool = True) -> ServerProc:
        srv = ServerProc(tiny_dir, log_dir, *flags)
        started.append(srv)
        return srv.wait_ready() if wait else srv

    yield start
    for srv in started:
        srv.stop()


MAIN_FLAGS = ("--served-model-name", "tiny", "--enable-metrics", "--tool-call-parser", "qwen25",
              "--reasoning-parser", "qwen3", "--max-total-tokens", "4096",
              "--bucket-time-to-first-token", "0.1", "1", "10")


@pytest.fixture(scope="session")
def server(start_server) -> ServerProc:
    """The shared server for tests that do not stop or break it."""
    return start_server(*MAIN_FLAGS)


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c
