"""--log-level sets the level of every logger, in the CLI and in the engine process; a value that
is not a level is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _serve(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    return subprocess.run([sys.executable, "-m", "infer", "serve", "--device", "cpu", *argv],
                          capture_output=True, text=True, env=env, timeout=120)


def test_log_level_filters_the_cli_logs():
    default = _serve("--model-path", "/nonexistent/model")
    quiet = _serve("--model-path", "/nonexistent/model", "--log-level", "warning")
    for res in (default, quiet):  # both get as far as the model path
        assert res.returncode == 2 and "error: --model-path" in res.stderr, res.stderr
    assert "INFO infer.config: platform default" in default.stderr
    assert "INFO" not in quiet.stderr


def test_bad_log_level_exits_2():
    res = _serve("--model-path", "x", "--log-level", "loud")
    assert res.returncode == 2 and "--log-level 'loud': not a log level" in res.stderr


def test_log_level_reaches_the_engine_process(tmp_path):
    sys.path.insert(0, str(TESTS / "engine"))
    sys.path.insert(0, str(TESTS / "server"))
    from server_proc import ServerProc
    from tiny import make_tiny_llama

    make_tiny_llama(tmp_path / "model")
    server = ServerProc(tmp_path / "model", tmp_path, "--log-level", "warning", "--dtype", "float32")
    try:
        server.wait_ready()
    finally:
        server.stop()
    out = server.output()
    assert "infer server is ready" in out
    assert " INFO " not in out and "engine INFO" not in out, out[-2000:]
