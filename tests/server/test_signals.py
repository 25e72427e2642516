"""SIGINT and SIGTERM to any process of the server's tree end in a drain and a clean exit.

A terminal's Ctrl-C and many process managers signal the whole process group, so the engine
process gets the signal too; a signal may also reach the server or the engine alone. In every case
a request that is running when the signal arrives must finish (the drain), and the server must
exit with code 0, its engine process gone, with no traceback in its log.
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

pytestmark = pytest.mark.slow

CASES = [(sig, target) for target in ("group", "server", "engine")
         for sig in (signal.SIGINT, signal.SIGTERM)]


@pytest.mark.parametrize(("sig", "target"), CASES, ids=[f"{s.name}-{t}" for s, t in CASES])
def test_signal_drains_and_exits_cleanly(start_server, sig, target):
    srv = start_server("--skip-server-warmup", own_group=True)
    engine = srv.engine_pid()
    body = {"prompt": "drain", "max_tokens": 300, "ignore_eos": True, "stream": True}
    reasons, chunks = [], 0
    with httpx.Client(base_url=srv.url, timeout=120) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunks += 1
            if chunks == 1:
                pid = {"group": -srv.proc.pid, "server": srv.proc.pid, "engine": engine}[target]
                os.kill(pid, sig)  # a negative pid signals the process group
            choice = json.loads(line[5:])["choices"][0]
            if choice["finish_reason"]:
                reasons.append(choice["finish_reason"])
    assert reasons == ["length"], f"the running request did not finish: {reasons}\n{srv.output()[-3000:]}"
    try:
        code = srv.proc.wait(60)
    except Exception:
        srv.stop(signal.SIGKILL)
        raise AssertionError(f"the server did not exit after {sig.name} to the {target}:\n"
                             f"{srv.output()[-3000:]}") from None
    log = srv.output()
    assert code == 0, f"exit code {code}:\n{log[-3000:]}"
    assert "draining" in log
    assert "Traceback" not in log and "engine is dead" not in log, log[-3000:]
    assert not os.path.exists(f"/proc/{engine}") or _zombie(engine), "the engine process is still running"


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] == "Z"
