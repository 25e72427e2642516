"""Parallel layouts through HTTP: --dp-size replicas behind one server (both serving, per-replica
stats, a dead replica ends the server), and --tp-size 2 ranks behind it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

PROMPT = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                if "zombie" in f.read():
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def single(start_server):
    s = start_server()
    yield s
    s.stop()


def test_dp2_both_replicas_serve_and_report(start_server, single):
    want = httpx.post(f"{single.url}/generate", json=PROMPT, timeout=120).json()["text"]
    s = start_server("--dp-size", "2", "--load-balance-method", "round_robin", "--enable-metrics")
    try:
        texts = [httpx.post(f"{s.url}/generate", json=PROMPT, timeout=120).json()["text"]
                 for _ in range(4)]
        assert texts == [want] * 4  # the same greedy answer from either replica
        info = httpx.get(f"{s.url}/get_server_info", timeout=30).json()
        replicas = info["engine"]["replicas"]
        assert [r["dp_rank"] for r in replicas] == [0, 1]
        assert all(r["prompt_tokens"] > 0 for r in replicas), replicas  # round robin used both
        assert info["engine"]["prompt_tokens"] == sum(r["prompt_tokens"] for r in replicas)
        metrics = httpx.get(f"{s.url}/metrics", timeout=30).text
        assert 'dp_rank="0"' in metrics and 'dp_rank="1"' in metrics
    finally:
        assert s.stop() == 0


def test_dp2_shortest_queue_spelling_and_a_dead_replica(start_server):
    s = start_server("--dp-size", "2", "--load-balance-method", "shortest_queue")
    try:
        assert httpx.post(f"{s.url}/generate", json=PROMPT, timeout=120).status_code == 200
        engines = [p for p in _children(s.proc.pid)
                   if b"spawn_main" in open(f"/proc/{p}/cmdline", "rb").read()]
        assert len(engines) == 2
        os.kill(engines[1], signal.SIGKILL)
        deadline = time.monotonic() + 30
        codes = set()
        while s.proc.poll() is None and time.monotonic() < deadline:
            try:
                codes.add(httpx.post(f"{s.url}/generate", json=PROMPT, timeout=5).status_code)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert s.proc.poll() not in (None, 0), s.output()[-2000:]
        assert codes <= {200, 503}, codes  # answers before the death was seen, then 503
        assert _gone(engines[0]), "the surviving replica's engine was left behind"
    finally:
        s.stop()


def test_tp2_server_answers_as_one_rank(start_server, single):
    """Also --gc-warning-threshold-secs, tiny: every process (HTTP, engine = rank 0, rank 1)
    logs its collections."""
    want = httpx.post(f"{single.url}/generate", json=PROMPT, timeout=120).json()["text"]
    s = start_server("--tp-size", "2", "--gc-warning-threshold-secs", "1e-9")
    try:
        got = httpx.post(f"{s.url}/generate", json=PROMPT, timeout=120).json()["text"]
        assert got == want
    finally:
        assert s.stop() == 0
    log = s.output()
    for who in ("HTTP", "engine", "rank 1"):
        assert f"long garbage collection in the {who} process: generation" in log, who


def test_two_nodes_on_one_host(start_server, single, tiny_dir, tmp_path):
    """--nnodes 2: node 0 (scheduler, rank 0, HTTP) and node 1 (rank 1) as two `infer serve`
    processes on 127.0.0.1 meeting at --dist-init-addr; the answer is one rank's."""
    import shutil

    from server_proc import free_port

    want = httpx.post(f"{single.url}/generate", json=PROMPT, timeout=120).json()["text"]
    addr = f"127.0.0.1:{free_port()}"
    flags = ("--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr)
    log = open(tmp_path / "node1.log", "w")
    node1 = subprocess.Popen([shutil.which("infer") or "infer", "serve", "--model-path", str(tiny_dir),
                              "--device", "cpu", *flags, "--node-rank", "1"],
                             stdout=log, stderr=subprocess.STDOUT)
    s = start_server(*flags, "--node-rank", "0")
    try:
        got = httpx.post(f"{s.url}/generate", json=PROMPT, timeout=120).json()["text"]
        assert got == want
        assert s.stop() == 0
        assert node1.wait(timeout=60) == 0, (tmp_path / "node1.log").read_text()[-2000:]
    finally:
        if node1.poll() is None:
            node1.kill()
        log.close()
