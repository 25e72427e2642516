"""`infer serve` and the reusable server-flag helper, through the real command line."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from infer.cli.common import ServerFlagsCommand, expand_list_flags, with_server_flags
from infer.core.config import ServerArgs
from typer.testing import CliRunner

TSV = Path(__file__).resolve().parents[3] / "shared" / "flags" / "server-flags.tsv"
VLLM = ["--model", "--max-model-len", "--gpu-memory-utilization", "--max-num-seqs",
        "--max-num-batched-tokens", "--enforce-eager", "--tensor-parallel-size",
        "--pipeline-parallel-size", "--data-parallel-size", "--served-model-name", "--seed",
        "--block-size", "--enable-prefix-caching", "--no-enable-prefix-caching", "--swap-space",
        "--quantization", "--kv-cache-dtype", "--api-key", "--chat-template", "--uvicorn-log-level"]


def _infer(*argv, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    full_env.update({"COLUMNS": "300", "TERMINAL_WIDTH": "300", **(env or {})})
    return subprocess.run([sys.executable, "-c", "from infer.cli.main import app; app()", *argv],
                          capture_output=True, text=True, env=full_env, timeout=timeout)


# -- a command using the helper, to observe parsed settings ---------------------------------------
app = typer.Typer()


@app.callback()
def _root() -> None:
    """test app"""


@app.command("show", cls=ServerFlagsCommand)
@with_server_flags
def show(label: str = "x", *, server_args: ServerArgs) -> None:
    a = server_args
    keys = ["model_path", "port", "host", "page_size", "context_length", "disable_cuda_graph",
            "disable_radix_cache", "cuda_graph_bs", "tp_size", "kv_cache_dtype", "mem_fraction_static",
            "moe_a2a_backend", "lora_paths"]
    typer.echo(json.dumps({"label": label, "values": {k: getattr(a, k) for k in keys},
                           "provenance": {k: a.provenance[k] for k in keys},
                           "explicit": [f for f, _ in a.explicit_flags()]}))


def _show(*argv, env=None):
    result = CliRunner().invoke(app, ["show", *argv], env=env)
    return result, (json.loads(result.stdout) if result.exit_code == 0 else None)


@pytest.mark.skipif(not TSV.exists(), reason="../shared not present")
def test_help_lists_every_inventory_flag_and_the_vllm_spellings():
    out = _infer("serve", "--help")
    assert out.returncode == 0, out.stderr
    shown = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.stdout))
    rows = list(csv.DictReader(open(TSV), delimiter="\t"))
    assert len(rows) == 336
    missing = [r["flag"] for r in rows
               if not ({r["flag"], *re.split(r"[,\s]+", r["aliases"] or "")} & shown)]
    assert missing == []
    assert [v for v in VLLM if v not in shown] == []
    for panel in ("Model and tokenizer", "HTTP server", "Memory and scheduling", "Deprecated arguments",
                  "vLLM-compatible spellings"):
        assert panel in out.stdout


def test_fa3_on_this_cpu_machine_exits_2_fast_with_one_clear_message():
    out = _infer("serve", "--model-path", "x", "--attention-backend", "fa3", timeout=60)
    assert out.returncode == 2
    err = out.stderr
    assert "Traceback" not in err
    assert err.startswith("error: --attention-backend fa3 is not")
    assert "device cpu (generation " in err
    assert len(err.strip().splitlines()) == 1
    from infer.core.plugins import get_plugin_host

    entry = get_plugin_host().matrix.lookup("cpu", get_plugin_host().select("cpu").generation,
                                             "--attention-backend", "fa3")
    assert entry.reason and entry.reason in err


def _serve(*argv, env=None):
    """`infer serve` in-process (the plugin host is loaded once per test process)."""
    from infer.cli.main import app as infer_app

    return CliRunner().invoke(infer_app, ["serve", *argv], env={"COLUMNS": "300", **(env or {})})


def test_config_file_env_and_command_line_through_serve(tmp_path):
    # --cuda-graph-max-bs cannot run on CPU, so the gate's message shows which source won.
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model-path: x\ncuda-graph-max-bs: 8\n")
    base = ["--config", str(cfg)]
    assert "--cuda-graph-max-bs 8 " in _serve(*base).stderr
    env = {"INFER_CUDA_GRAPH_MAX_BS": "16"}
    assert "--cuda-graph-max-bs 16 " in _serve(*base, env=env).stderr
    out = _serve(*base, "--cuda-graph-max-bs", "32", env=env)
    assert out.exit_code == 2 and "--cuda-graph-max-bs 32 " in out.stderr


@pytest.mark.parametrize("argv, message", [
    (["--port", "x"], "--port"),
    (["--no-such-flag", "1"], "No such option: --no-such-flag"),
    (["--dtype", "float99"], "error: --dtype: invalid choice 'float99'"),
    (["--model-path", "x", "--swap-space", "4"], "error: --swap-space: infer has no CPU swap space"),
    (["--enable-hierarchical-cache", "--disable-radix-cache"], "mutually exclusive"),
    (["--max-model-len", "10", "--context-length", "20"], "set the same setting; give only one"),
    (["--model-path", "x", "--device", "nosuchdevice"], "error: --device nosuchdevice"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message):
    out = _serve(*argv)
    assert out.exit_code == 2, out.output
    assert message in out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)


def test_helper_parses_names_aliases_vllm_spellings_and_lists():
    result, data = _show("--model", "m", "--tp-size", "2", "--max-model-len", "4096", "--enforce-eager",
                         "--no-enable-prefix-caching", "--cuda-graph-bs", "1", "2", "4",
                         "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.7", "--label", "y")
    assert result.exit_code == 0, result.output
    v = data["values"]
    assert data["label"] == "y"
    assert (v["model_path"], v["tp_size"], v["context_length"]) == ("m", 2, 4096)
    assert v["disable_cuda_graph"] is True and v["disable_radix_cache"] is True
    assert v["cuda_graph_bs"] == [1, 2, 4] and v["kv_cache_dtype"] == "fp8_e4m3"
    assert v["mem_fraction_static"] == 0.7
    assert data["provenance"]["context_length"] == "user" and data["provenance"]["port"] == "default"
    assert "--context-length" in data["explicit"] and "--port" not in data["explicit"]


def test_helper_command_line_beats_env_beats_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 1111\nhost: 0.0.0.0\npage-size: 8\n")
    env = {"INFER_PORT": "2222", "INFER_PAGE_SIZE": "4"}
    result, data = _show("--config", str(cfg), "--page-size", "32", env=env)
    assert result.exit_code == 0, result.output
    assert data["values"]["page_size"] == 32 and data["provenance"]["page_size"] == "user"
    assert data["values"]["port"] == 2222 and data["provenance"]["port"] == "env"
    assert data["values"]["host"] == "0.0.0.0" and data["provenance"]["host"] == "config"


def test_helper_deprecated_flag_warns_and_maps():
    result, data = _show("--enable-deepep-moe")
    assert result.exit_code == 0, result.output
    assert data["values"]["moe_a2a_backend"] == "deepep"
    assert "warning: --enable-deepep-moe is deprecated; using --moe-a2a-backend deepep" in result.stderr


def test_helper_bad_value_exits_2():
    result, _ = _show("--page-size", "16", "--chunked-prefill-size", "100")
    assert result.exit_code == 2
    assert "--chunked-prefill-size 100 must be divisible by --page-size 16" in result.stderr


def test_list_flags_take_several_values_after_one_name():
    assert expand_list_flags(["--cuda-graph-bs", "1", "2", "--port", "3"]) == \
        ["--cuda-graph-bs", "1", "--cuda-graph-bs", "2", "--port", "3"]
    assert expand_list_flags(["--numa-node", "--port", "3"]) == ["--numa-node", "", "--port", "3"]
    result, data = _show("--lora-paths", "a=/x", "b=/y")
    assert data["values"]["lora_paths"] == ["a=/x", "b=/y"]


def test_helper_refuses_parameters_that_clash_with_server_flags():
    def bad(port: int = 1, *, server_args: ServerArgs) -> None: ...

    with pytest.raises(TypeError, match="clash with server flags"):
        with_server_flags(bad)


def test_optional_commands_tolerate_only_their_own_absence(monkeypatch):
    import importlib

    from infer.cli import main

    assert main._optional_module("no_such_command_module") is None

    def broken(name):
        raise ModuleNotFoundError("No module named 'torch_npu'", name="torch_npu")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        main._optional_module("doctor")


def test_doctor_is_mounted_when_present():
    from infer.cli.main import app as infer_app

    result = CliRunner().invoke(infer_app, ["--help"])
    assert "serve" in result.stdout
    if (Path(__file__).resolve().parents[2] / "cli" / "doctor.py").exists():
        assert "doctor" in result.stdout
