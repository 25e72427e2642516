"""`infer serve` refuses a model path it cannot resolve before any engine process starts."""

from __future__ import annotations

import os
import subprocess
import sys


def _serve(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    return subprocess.run([sys.executable, "-c", "from infer.cli.main import app; app()", "serve",
                           *argv], capture_output=True, text=True, env=env, timeout=120)


def test_missing_local_path_exits_2_with_one_message(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = _serve("--model-path", str(missing), "--port", "1")
    assert proc.returncode == 2, proc.stderr
    assert str(missing) in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_file_that_is_not_gguf_exits_2(tmp_path):
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"\0" * 16)
    proc = _serve("--model-path", str(bogus), "--port", "1")
    assert proc.returncode == 2, proc.stderr
    assert "not a .gguf" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_no_model_path_exits_2_with_one_message():
    proc = _serve("--port", "1")
    assert proc.returncode == 2, proc.stderr
    assert "--model-path" in proc.stderr and "smollm2" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
