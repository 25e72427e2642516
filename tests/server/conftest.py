"""Fixtures: a tiny random Llama on disk and real `infer serve` processes on 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_proc import ServerProc  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(d)
    return d


@pytest.fixture(scope="session")
def start_server(tiny_dir, tmp_path_factory):
    started: list[ServerProc] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(*flags: str, wait: bool = True, own_group: bool = False) -> ServerProc:
        srv = ServerProc(tiny_dir, log_dir, *flags, own_group=own_group)
        started.append(srv)
        return srv.wait_ready() if wait else srv

    yield start
    for srv in started:
        srv.stop()


MAIN_FLAGS = ("--served-model-name", "tiny", "--enable-metrics", "--tool-call-parser", "qwen25",
              "--reasoning-parser", "qwen3", "--max-total-tokens", "4096",
              "--bucket-time-to-first-token", "0.1", "1", "10", "--bucket-inter-token-latency", "0.5",
              "--bucket-e2e-request-latency", "30")


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
