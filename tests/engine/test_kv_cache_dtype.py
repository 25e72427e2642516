"""--kv-cache-dtype end to end on the CPU: the value reaches ModelArch.kv_dtype, the attention
backend and the model runner's cache; the pool holds twice the tokens per byte in fp8; the
torch_native backend serves an fp8 cache; the CPU matrix still refuses fp8 at start-up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from infer.core.cache.page_pool import kv_bytes_per_token
from infer.core.config import ServerArgs
from infer.core.config.gate import apply_platform_defaults
from infer.core.engine.engine_core import EngineCore
from infer.core.model.loader.dtype import resolve_kv_dtype
from infer.core.plugins import get_plugin_host


@pytest.mark.parametrize("value,expect", [
    ("auto", torch.bfloat16), ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
    ("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_resolve_kv_dtype(value, expect):
    assert resolve_kv_dtype(value, torch.bfloat16) is expect


def test_bf16_kv_cache_of_a_float32_model_is_bf16():
    """SGLang's meaning: "bf16" stores bf16 whatever the model dtype; "auto" keeps the model's."""
    assert resolve_kv_dtype("bf16", torch.float32) is torch.bfloat16
    assert resolve_kv_dtype("bfloat16", torch.float32) is torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32) is torch.float32


def test_resolve_kv_dtype_refuses_fp4_and_unknown():
    with pytest.raises(NotImplementedError, match="fp4_e2m1"):
        resolve_kv_dtype("fp4_e2m1", torch.bfloat16)
    with pytest.raises(ValueError, match="'int4'"):
        resolve_kv_dtype("int4", torch.bfloat16)


def _core(model_dir, monkeypatch, memory: int | None = None, **flags) -> EngineCore:
    """An EngineCore on the CPU platform without the start-up gate (whose CPU matrix refuses
    fp8): the core's own plumbing is what is under test. ``memory`` fixes memory_available."""
    flags.setdefault("dtype", "bfloat16")
    flags.setdefault("max_total_tokens", 4096)
    args = ServerArgs(model_path=str(model_dir), device="cpu", **flags)
    platform = get_plugin_host().select("cpu")
    if memory is not None:
        monkeypatch.setattr(platform, "memory_available", lambda: memory)
    apply_platform_defaults(args, platform)
    return EngineCore(args, platform=platform)


@pytest.mark.parametrize("value,dtype", [("fp8", torch.float8_e4m3fn),
                                         ("fp8_e5m2", torch.float8_e5m2),
                                         ("auto", torch.bfloat16)])
def test_kv_cache_dtype_reaches_arch_backend_and_cache(tiny_model, monkeypatch, value, dtype):
    core = _core(tiny_model[0], monkeypatch, kv_cache_dtype=value)
    assert core.arch.kv_dtype is dtype
    assert core.runner.attn_backend.config.kv_dtype is dtype
    assert all(c.dtype is dtype for c in core.runner.kv_cache.k + core.runner.kv_cache.v)


def test_fp8_pool_holds_twice_the_tokens_of_bf16(tiny_model, monkeypatch):
    memory = 2**30
    bf16 = _core(tiny_model[0], monkeypatch, memory=memory, kv_cache_dtype="auto")
    weights = sum(p.numel() * p.element_size() for p in bf16.loaded.model.parameters())
    a = bf16.arch
    per_token = kv_bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, 2)
    frac = (weights + 3000 * per_token) / memory  # room for 3000 bf16 tokens after the weights
    bf16 = _core(tiny_model[0], monkeypatch, memory=memory, kv_cache_dtype="auto",
                 max_total_tokens=None, mem_fraction_static=frac)
    fp8 = _core(tiny_model[0], monkeypatch, memory=memory, kv_cache_dtype="fp8_e4m3",
                max_total_tokens=None, mem_fraction_static=frac)
    assert abs(bf16.pool.capacity - 3000) <= 2
    assert abs(fp8.pool.capacity - 2 * bf16.pool.capacity) <= 2
    assert fp8.runner.kv_cache.k[0].element_size() == 1


def test_torch_native_fp8_cache_generates(tiny_model, monkeypatch):
    """Greedy decoding over an fp8 cache runs through the real engine; its first token (from the
    prefill, which reads the just-written fp8 keys back) matches the bf16-cache run."""
    from helpers import random_prompts, run_all

    prompts = random_prompts(3, seed=9)
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    ref = run_all(_core(tiny_model[0], monkeypatch, kv_cache_dtype="auto"), prompts, params)
    got = run_all(_core(tiny_model[0], monkeypatch, kv_cache_dtype="fp8_e4m3"), prompts, params)
    assert all(len(got[k][0]) == 6 for k in ref)
    assert [got[k][0][0] for k in ref] == [ref[k][0][0] for k in ref]


def test_quantization_param_path_is_refused(tiny_model, monkeypatch, tmp_path):
    with pytest.raises(NotImplementedError, match="--quantization-param-path"):
        _core(tiny_model[0], monkeypatch, kv_cache_dtype="fp8_e4m3",
              quantization_param_path=str(tmp_path / "scales.json"))


@pytest.mark.parametrize("argv", [["--kv-cache-dtype", "fp8_e4m3"], ["--kv-cache-dtype", "fp8"],
                                  ["--kv-cache-dtype", "fp8_e5m2"], ["--quantization", "fp8"]])
def test_cpu_gate_refuses_fp8(argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env.update({"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
    res = subprocess.run([sys.executable, "-c", "from infer.cli.main import app; app()", "serve",
                          "--device", "cpu", "--model-path", "/nonexistent", *argv],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    value = "fp8_e4m3" if argv[1] == "fp8" and argv[0] == "--kv-cache-dtype" else argv[1]
    assert f"{argv[0]} {value} is not implemented on device cpu" in res.stderr
