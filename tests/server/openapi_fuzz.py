"""Fuzz a real server through its OpenAPI document with schemathesis; the server must never fail.

``python tests/server/openapi_fuzz.py [--max-examples N] [--seed S]`` (the nox session
``openapi-fuzz``): make the tiny random Llama, serve it, run ``schemathesis run`` over every
operation of /openapi.json with the check ``not_a_server_error`` (no status >= 500), then check
that the server still answers a plain completion and that a SIGTERM ends it with code 0. Exit
code 0 only when all of that holds; the number of requests sent is printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from server_proc import ServerProc  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402

SERVER_FLAGS = ("--skip-server-warmup", "--max-total-tokens", "4096", "--served-model-name", "tiny")


def run_schemathesis(url: str, max_examples: int, seed: int, report: Path,
                     phases: str = "examples,coverage,fuzzing") -> tuple[int, int, str]:
    """(exit code, requests sent, output tail) of one ``schemathesis run`` against ``url``."""
    exe = shutil.which("schemathesis") or shutil.which("st")
    if exe is None:
        raise SystemExit("schemathesis is not installed: pip install 'schemathesis>=4'")
    cmd = [exe, "run", f"{url}/openapi.json", "--checks", "not_a_server_error",
           "--max-examples", str(max_examples), "--seed", str(seed), "--request-timeout", "120",
           "--wait-for-schema", "60", "--phases", phases,
           "--report", "ndjson", "--report-ndjson-path", str(report)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    sent = 0
    for line in report.read_text().splitlines() if report.exists() else []:
        # each ScenarioFinished event carries the interactions (request + response) of one case
        sent += len(json.loads(line).get("ScenarioFinished", {}).get("recorder", {}).get("interactions", {}))
    return out.returncode, sent, (out.stdout + out.stderr)[-6000:]


def still_serves(url: str) -> bool:
    with httpx.Client(base_url=url, timeout=120) as c:
        ok = c.get("/health").status_code == 200
        # greedy and past any end token: a sampled end token (about 1 request in 400 of the tiny
        # model's default sampling) would end it short of 4 tokens on a healthy server
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4,
                                            "temperature": 0, "ignore_eos": True})
        return ok and r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-examples", type=int, default=20, help="cases per operation and phase")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="infer-fuzz-") as tmp:
        model, logs = Path(tmp) / "model", Path(tmp) / "logs"
        model.mkdir()
        logs.mkdir()
        make_tiny_llama(model)
        srv = ServerProc(model, logs, *SERVER_FLAGS).wait_ready()
        try:
            code, sent, tail = run_schemathesis(srv.url, a.max_examples, a.seed, Path(tmp) / "run.ndjson")
            serving = still_serves(srv.url)
        finally:
            exit_code = srv.stop(signal.SIGTERM)
        print(tail)
        print(f"schemathesis: exit code {code}, {sent} requests; server still serving: {serving}; "
              f"server exit code {exit_code}")
        return 0 if (code == 0 and serving and exit_code == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
