"""Shared fixtures for the CPU plugin's tests."""

from __future__ import annotations

import ctypes
import platform
import subprocess

import pytest


@pytest.fixture(params=["native", "torch"])
def kernel_mode(request, monkeypatch) -> str:
    """Run a test with the native kernels (skipped when they cannot be built here) and without."""
    from infer_cpu import kernels

    if request.param == "native":
        if kernels.load() is None:
            pytest.skip(f"native kernels unavailable: {kernels.status().detail}")
    else:
        monkeypatch.setattr(kernels, "_state", {"lib": None, "detail": "off for this test"})
    return request.param


def _greedy(core, prompts, n):
    """Greedy continuations of ``prompts`` (token id lists) through an EngineCore, batched;
    ``n`` new tokens each, or a list with one count per prompt."""
    outs = {}
    counts = n if isinstance(n, list) else [n] * len(prompts)
    for i, (p, k) in enumerate(zip(prompts, counts, strict=True)):
        core.add_request(core.make_request(f"r{i}", p, {"max_new_tokens": k, "temperature": 0.0,
                                                        "ignore_eos": True}))
    while core.has_work():
        for o in core.step():
            outs.setdefault(o.rid, []).extend(o.new_token_ids)
    return [outs[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture
def greedy():
    return _greedy


def _with_threads(n: int, fn):
    """fn() with torch (and so the native kernels' OpenMP team) on n threads."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


@pytest.fixture
def with_threads():
    return _with_threads


@pytest.fixture
def tiny_bf16(tmp_path):
    """A tiny random llama checkpoint in bf16 with a real tokenizer, saved at tmp_path (which
    is returned)."""
    import sys
    from pathlib import Path

    import torch

    tests = Path(__file__).parents[3] / "tests"
    sys.path[:0] = [str(tests / "model"), str(tests / "server")]
    from hf_tiny import save_tiny
    from tiny_model import make_tokenizer

    tok = make_tokenizer(tmp_path)
    save_tiny("llama", tmp_path, dtype=torch.bfloat16, vocab_size=len(tok) + 8,
              intermediate_size=160).save_pretrained(tmp_path)
    return tmp_path


def _compile(tmp_path_factory, name: str, flags: list[str], source) -> ctypes.CDLL:
    """``source`` (a kernel library's C file) built here with ``flags``, loaded; the test skips
    without a C compiler on x86-64."""
    from infer_cpu.native_build import compiler

    cc = compiler()
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs a C compiler on x86-64")
    out = tmp_path_factory.mktemp(name) / f"lib{name}.so"
    subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", str(out), str(source), "-lm"],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(out))


def _compile_bf16(tmp_path_factory, name: str, flags: list[str]) -> ctypes.CDLL:
    """The bf16 kernel library built here with ``flags`` (bound as the plugin binds its own)."""
    from infer_cpu.kernels import bf16 as kb
    from infer_cpu.native_build import BF16_SOURCE

    return kb.bind(_compile(tmp_path_factory, name, flags, BF16_SOURCE))


def _compile_kernels(tmp_path_factory, name: str, flags: list[str]) -> ctypes.CDLL:
    """The GGUF kernel library (``infer_cpu_kernels.c``) built here with ``flags``, bound as the
    plugin binds its own."""
    from infer_cpu import kernels
    from infer_cpu.native_build import SOURCE

    return kernels.bind(_compile(tmp_path_factory, name, flags, SOURCE))


@pytest.fixture(scope="session")
def compile_bf16():
    """``_compile_bf16``, for tests' own builds of the bf16 library."""
    return _compile_bf16


@pytest.fixture(scope="session")
def compile_kernels():
    """``_compile_kernels``, for tests' own builds of the GGUF kernel library."""
    return _compile_kernels


@pytest.fixture(scope="module")
def avx512_lib(tmp_path_factory) -> ctypes.CDLL:
    """The bf16 library's vdpbf16ps path on a CPU that would take AMX tiles: built without them."""
    if "avx512_bf16" not in open("/proc/cpuinfo").read():
        pytest.skip("CPU without AVX-512 BF16")
    lib = _compile_bf16(tmp_path_factory, "avx512", ["-O3", "-march=native", "-mno-amx-tile",
                                                     "-mno-amx-bf16", "-mno-amx-int8"])
    assert lib.infer_bf16_isa() == 3
    return lib

