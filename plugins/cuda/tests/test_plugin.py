"""Plugin wiring without a GPU: probe, SM mapping, registrations, per-SM matrix, defaults."""

from __future__ import annotations

import os

import pytest
from infer.core.plugins import PluginHost
from infer.core.support import Status


def _host() -> PluginHost:
    import infer_cpu
    import infer_cuda

    host = PluginHost()
    host.add_module(infer_cpu)
    host.add_module(infer_cuda)
    return host


@pytest.mark.parametrize("cc,gen", [((8, 0), "sm80"), ((8, 6), "sm80"), ((8, 9), "sm89"),
                                    ((9, 0), "sm90"), ((10, 0), "sm100"), ((12, 0), "sm120"),
                                    ((7, 5), None)])
def test_sm_generation(cc, gen):
    from infer_cuda.probe import sm_generation

    assert sm_generation(*cc) == gen


def test_probe_reports_reason_without_driver():
    from infer_cuda.probe import probe

    result = probe()
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("this machine has an NVIDIA driver")
    assert not result.found
    assert "driver" in result.reason or "torch" in result.reason


def test_probe_creates_no_cuda_context():
    """In a fresh process: probing leaves CUDA uninitialised; on a GPU machine it finds the
    device with the generation torch reports."""
    import json
    import subprocess
    import sys

    code = ("import json, torch; from infer_cuda.probe import probe, sm_generation; r = probe(); "
            "init = torch.cuda.is_initialized(); "
            "gen = sm_generation(*torch.cuda.get_device_capability()) if torch.cuda.is_available() "
            "else None; print(json.dumps([r.found, init, r.device and r.device.generation, gen]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found, initialised, probed_gen, torch_gen = json.loads(out.stdout.strip().splitlines()[-1])
    assert not initialised
    if torch_gen is not None:
        assert found and probed_gen == torch_gen


def test_registrations():
    host = _host()
    reg = host.registries
    for table, key in [(reg.attention, "triton"), (reg.attention, "torch_native"),
                       (reg.linear, None), (reg.linear, "fp8"), (reg.moe, "triton"),
                       (reg.moe, "auto"), (reg.communicators, "nccl"),
                       (reg.graph_runners, "cuda_graph")]:
        assert reg.pick(table, key, "cuda") is not None, key
    assert "cuda" in reg.platforms
    assert not [f for f in host.failures if f.name.startswith("infer_cuda")]


@pytest.mark.parametrize("value,gen,status", [
    ("fa3", "sm80", Status.UNSUPPORTED), ("fa3", "sm100", Status.UNSUPPORTED),
    ("fa3", "sm90", Status.NOT_IMPLEMENTED), ("trtllm_mha", "sm90", Status.UNSUPPORTED),
    ("triton", "sm90", Status.SUPPORTED), ("triton", "sm89", Status.EXPERIMENTAL),
    ("trtllm_mha", "sm100", Status.NOT_IMPLEMENTED),
    ("torch_native", "sm120", Status.SUPPORTED)])
def test_attention_matrix(value, gen, status):
    assert _host().matrix.lookup("cuda", gen, "--attention-backend", value).status is status


def test_fp8_rows_follow_sm():
    m = _host().matrix
    for flag, value in [("--kv-cache-dtype", "fp8_e4m3"), ("--quantization", "fp8")]:
        assert m.lookup("cuda", "sm80", flag, value).status is Status.UNSUPPORTED
        assert m.lookup("cuda", "sm90", flag, value).status is not Status.UNSUPPORTED


def test_default_attention_backend(monkeypatch):
    from infer_cuda import platform

    monkeypatch.setattr(platform, "flashinfer_available", lambda: True)
    assert platform.default_attention_backend("sm90") == "flashinfer"
    assert platform.default_attention_backend("sm80") == "triton"
    monkeypatch.setattr(platform, "flashinfer_available", lambda: False)
    assert platform.default_attention_backend("sm90") == "triton"


def test_capture_sizes():
    from infer.core.config.views import GraphConfig
    from infer_cuda.graph_runner import capture_sizes

    assert capture_sizes(GraphConfig(batch_sizes=[4, 1, 4], max_bs=None)) == [1, 4]
    sizes = capture_sizes(GraphConfig(batch_sizes=None, max_bs=40))
    assert sizes[0] == 1 and sizes[-1] == 40 and sizes == sorted(sizes)
    capped = capture_sizes(GraphConfig(batch_sizes=None, max_bs=64, max_running_requests=10))
    assert capped[-1] == 10
