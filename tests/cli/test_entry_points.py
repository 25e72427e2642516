"""Peer command lines: vLLM's positional model (`infer serve MODEL`), `python -m infer`, and SGLang's
`python -m infer.launch_server` (also `python -m infer.server.launch`) behave as `infer serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

FA3_ERROR = "error: --attention-backend fa3 is not supported on device cpu"


def _python_m(*argv: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env.update(COLUMNS="300", TERMINAL_WIDTH="300")
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture
def launched(monkeypatch):
    """`infer serve` in-process up to launch_server, which records the settings it was given."""
    import infer.cli.serve as serve_mod
    import infer.server.launch as launch_mod

    seen = []
    monkeypatch.setattr(serve_mod, "_check_model_source", lambda args: None)
    monkeypatch.setattr(launch_mod, "launch_server", lambda args: seen.append(args) or 0)
    return seen


def _serve(*argv: str):
    from infer.cli.main import app

    return CliRunner().invoke(app, ["serve", *argv], env={"COLUMNS": "300"})


def test_positional_model_as_vllm_serve_takes_it(launched):
    out = _serve("smollm2", "--max-model-len", "2048")
    assert out.exit_code == 0, out.output
    (args,) = launched
    assert (args.model_path, args.context_length) == ("smollm2", 2048)
    assert args.provenance["model_path"] == "user" and args.spelling("model_path") == "MODEL"


def test_positional_model_agreeing_with_model_path_is_accepted_and_disagreeing_refused(launched):
    assert _serve("m", "--model-path", "m").exit_code == 0
    out = _serve("a", "--model-path", "b")
    assert out.exit_code == 2 and not launched[1:]
    assert "the positional MODEL 'a' and --model-path 'b' disagree" in out.output


def test_a_second_positional_is_refused():
    out = _serve("a", "b")
    assert out.exit_code == 2 and "unexpected extra argument" in out.output.lower()


def test_python_m_infer_is_the_infer_command():
    out = _python_m("infer", "--help")
    assert out.returncode == 0, out.stderr
    assert "Usage: infer" in out.stdout and "serve" in out.stdout and "doctor" in out.stdout
    report = json.loads(_python_m("infer", "doctor", "--json").stdout)
    assert report["active"]["platform"] == "cpu"


@pytest.mark.parametrize("module", ["infer.launch_server", "infer.server.launch"])
def test_launch_server_modules_behave_as_infer_serve(module):
    helped = _python_m(module, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--model-path" in helped.stdout and "--attention-backend" in helped.stdout
    refused = _python_m(module, "--model-path", "x", "--attention-backend", "fa3")
    assert refused.returncode == 2 and refused.stderr.startswith(FA3_ERROR), refused.stderr
    assert "Traceback" not in refused.stderr
