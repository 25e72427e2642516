"""Serving flags the gate used to refuse although they were wired. --stream-output: streamed chunks
carry disjoint segments (only what is new), in the HTTP server's /generate and in the offline
Engine, and they add up to the whole answer. --enable-cache-report: the OpenAI usage says how many
prompt tokens came from the prefix cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "engine"))
sys.path.insert(0, str(TESTS / "server"))

from tiny import CORPUS, make_tiny_llama  # noqa: E402

PARAMS = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 12}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    make_tiny_llama(d)
    return d


def _check_segments(chunks: list[dict], whole: dict) -> None:
    assert len(chunks) > 1
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]  # disjoint, in order
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_server_streams_disjoint_segments_and_reports_cached_tokens(tiny, tmp_path):
    import httpx
    from server_proc import ServerProc

    server = ServerProc(tiny, tmp_path, "--stream-output", "--enable-cache-report",
                        "--dtype", "float32").wait_ready()
    try:
        body = {"text": CORPUS[0], "sampling_params": PARAMS}
        whole = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()
        with httpx.stream("POST", f"{server.url}/generate", json={**body, "stream": True}, timeout=120) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        chat = {"model": str(tiny), "messages": [{"role": "user", "content": CORPUS[1]}], "max_tokens": 4}
        usages = [httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=120).json()["usage"]
                  for _ in range(2)]
    finally:
        server.stop()
    assert len(whole["output_ids"]) == 12
    _check_segments(chunks, whole)
    cold, warm = (u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cold == 0 and 0 < warm < usages[1]["prompt_tokens"]  # the repeated prompt hits the cache


def test_engine_streams_disjoint_segments(tiny):
    from infer.core import Engine

    eng = Engine(model_path=str(tiny), stream_output=True, dtype="float32", max_total_tokens=4096)
    try:
        whole = eng.generate(prompt=CORPUS[0], sampling_params=PARAMS)
        chunks = list(eng.generate(prompt=CORPUS[0], sampling_params=PARAMS, stream=True))
    finally:
        eng.shutdown()
    _check_segments(chunks, whole)
