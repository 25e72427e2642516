"""The plugin contract from a third party's side: discovery, API version, failures, selection,
and a third-party attention backend that the gate accepts and the registry resolves."""

from __future__ import annotations

import math
import sys
import types

import infer_cpu
import pytest
import torch
from infer.core.hookspecs import hookimpl
from infer.core.ops.attention import AttentionConfig, AttentionMetadata, write_kv
from infer.core.platform import DeviceInfo, Platform, ProbeResult
from infer.core.plugins import PlatformSelectionError, PluginHost, Registries
from infer.core.support import Status

from .conftest import write_dist

GROUP = "infer.plugins.contract-test"


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _host_with_sample(site) -> PluginHost:
    write_dist(site, "infer-sample-attn", {"sample-attn": "infer_sample_attn"}, GROUP)
    host = PluginHost()
    host.add_module(infer_cpu)
    host.load_entry_points(GROUP)
    return host


# -- a third-party attention backend ------------------------------------------------------------
def test_third_party_backend_is_discovered_registered_and_in_the_matrix(site):
    host = _host_with_sample(site)
    rec = next(r for r in host.records if r.name == "sample-attn")
    assert rec.loaded and rec.version == "0.1" and not host.failures
    platform = host.select("cpu")
    assert platform.supports("--attention-backend", "sample_sdpa")
    from infer_sample_attn.backend import SampleSdpaBackend

    assert Registries.pick(host.registries.attention, "sample_sdpa", "cpu") is SampleSdpaBackend
    assert Registries.pick(host.registries.attention, "sample_sdpa", "cuda") is None
    assert "sample_sdpa" in Registries.names_for(host.registries.attention, "cpu")


def test_gate_accepts_the_third_party_backend_and_refuses_an_unknown_one(site):
    gate = pytest.importorskip("infer.core.config.gate")
    from infer.core.config import ServerArgs

    host = _host_with_sample(site)
    platform = host.select("cpu")
    args = ServerArgs(model_path="x", attention_backend="sample_sdpa")
    gate.check_flags(args, platform, host)  # passes: registered and supported on cpu
    factory = Registries.pick(host.registries.attention, args.attention_backend, platform.name)
    assert factory.__name__ == "SampleSdpaBackend"

    bare = PluginHost()  # the same request without the plugin installed is refused
    bare.add_module(infer_cpu)
    with pytest.raises(gate.GateError) as exc:
        gate.check_flags(args, bare.select("cpu"), bare)
    msg = str(exc.value)
    assert "--attention-backend sample_sdpa" in msg and "cpu" in msg


def _reference(q, keys, vals, scale):
    """Naive causal attention in float64; keys/vals hold the whole sequence [L, Hkv, D]."""
    n, h, _ = q.shape
    length, hkv = keys.shape[0], keys.shape[1]
    out = torch.zeros(n, h, q.shape[2], dtype=torch.float64)
    for j in range(n):
        pos = length - n + j
        for head in range(h):
            kh = keys[: pos + 1, head // (h // hkv)].double()
            w = torch.softmax(kh @ q[j, head].double() * scale, dim=0)
            out[j, head] = w @ vals[: pos + 1, head // (h // hkv)].double()
    return out


def test_third_party_backend_computes_attention(site):
    host = _host_with_sample(site)
    factory = Registries.pick(host.registries.attention, "sample_sdpa", "cpu")
    torch.manual_seed(0)
    heads, kv_heads, dim, page = 4, 2, 16, 4
    cfg = AttentionConfig(num_heads=heads, num_kv_heads=kv_heads, head_dim=dim,
                          scale=1 / math.sqrt(dim), page_size=page, dtype=torch.float32,
                          kv_dtype=torch.float32, device=torch.device("cpu"), num_layers=1)
    backend = factory(cfg)
    k_cache = torch.zeros(16, page, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    # sequence 0: 6 cached tokens + 3 new (prefill chunk); sequence 1: 5 cached + 1 (decode)
    prefix, extend = [6, 5], [3, 1]
    tables = torch.tensor([[7, 2, 11, 0], [3, 9, 0, 0]], dtype=torch.int32)
    full_k = [torch.randn(p + e, kv_heads, dim) for p, e in zip(prefix, extend, strict=True)]
    full_v = [torch.randn(p + e, kv_heads, dim) for p, e in zip(prefix, extend, strict=True)]

    def slots(i, positions):
        return torch.tensor([int(tables[i, t // page]) * page + t % page for t in positions])

    for i in range(2):  # the cached prefix was written by earlier steps
        write_kv(full_k[i][: prefix[i]], full_v[i][: prefix[i]], k_cache, v_cache,
                 slots(i, range(prefix[i])))
    q = torch.randn(sum(extend), heads, dim)
    meta = AttentionMetadata(
        num_seqs=2, num_tokens=4, page_size=page,
        query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32),
        seq_lens=torch.tensor([9, 6], dtype=torch.int32),
        prefix_lens=torch.tensor(prefix, dtype=torch.int32), block_tables=tables,
        slot_mapping=torch.cat([slots(0, range(6, 9)), slots(1, range(5, 6))]),
        seq_lens_cpu=[9, 6], extend_lens_cpu=extend, max_seq_len=9, max_extend_len=3)
    backend.plan(meta)
    new_k = torch.cat([full_k[0][6:], full_k[1][5:]])
    new_v = torch.cat([full_v[0][6:], full_v[1][5:]])
    out = backend.forward(q, new_k, new_v, k_cache, v_cache, layer_id=0)
    ref = torch.cat([_reference(q[:3], full_k[0], full_v[0], cfg.scale),
                     _reference(q[3:], full_k[1], full_v[1], cfg.scale)])
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # the new keys landed in the cache at their slots
    torch.testing.assert_close(k_cache.view(-1, kv_heads, dim)[meta.slot_mapping], new_k)


# -- refusals and recorded failures -------------------------------------------------------------
def test_other_api_version_is_refused_with_the_reason():
    host = PluginHost()
    called = []
    mod = _module("future_plugin", INFER_API_VERSION=2,
                  register_platforms=hookimpl(lambda register: called.append(register)))
    assert host.add_module(mod) is False
    (rec,) = host.failures
    assert "plugin API 2" in rec.error and "speaks 1" in rec.error
    assert not called and "future_plugin" not in host.registries.platforms


def test_missing_api_version_is_refused():
    host = PluginHost()
    assert host.add_module(_module("anon")) is False
    assert "INFER_API_VERSION" in host.failures[0].error


def test_import_failure_is_recorded(site):
    (site / "broken_plugin.py").write_text("import a_module_that_does_not_exist\n")
    write_dist(site, "infer-broken", {"broken": "broken_plugin"}, GROUP)
    host = PluginHost()
    host.load_entry_points(GROUP)
    (rec,) = host.failures
    assert rec.name == "broken" and not rec.loaded
    assert "import failed" in rec.error and "a_module_that_does_not_exist" in rec.error
    sys.modules.pop("broken_plugin", None)


def test_hook_failure_is_recorded():
    def register_attention_backends(register):
        raise RuntimeError("kernel library missing")

    host = PluginHost()
    host.add_module(_module("flaky", INFER_API_VERSION=1,
                            register_attention_backends=hookimpl(register_attention_backends)))
    assert any("kernel library missing" in f.error for f in host.failures)


# -- platform selection ---------------------------------------------------------------------------
class _FakePlatform(Platform):
    pass


def _accelerator(name: str, found: bool = True, raises: bool = False) -> types.ModuleType:
    def probe() -> ProbeResult:
        if raises:
            raise OSError("driver exploded")
        if not found:
            return ProbeResult.not_found(name, f"no {name} device")
        return ProbeResult(platform=name, found=True,
                           device=DeviceInfo(kind=name, generation="g1", name=name, memory_bytes=1))

    def factory(result: ProbeResult) -> Platform:
        p = _FakePlatform(result.device)
        p.name = name
        return p

    def register_platforms(register):
        register(name, probe, factory)

    return _module(f"fake_{name}", INFER_API_VERSION=1,
                   register_platforms=hookimpl(register_platforms))


@pytest.fixture
def two_accelerators(monkeypatch):
    monkeypatch.delenv("INFER_DEVICE", raising=False)
    host = PluginHost()
    host.add_module(infer_cpu)
    host.add_module(_accelerator("fakea"))
    host.add_module(_accelerator("fakeb"))
    return host


def test_ambiguous_choice_names_both(two_accelerators):
    with pytest.raises(PlatformSelectionError) as exc:
        two_accelerators.select()
    assert "fakea" in str(exc.value) and "fakeb" in str(exc.value)
    assert "--device" in str(exc.value) and "INFER_DEVICE" in str(exc.value)


def test_infer_device_is_honoured(two_accelerators, monkeypatch):
    monkeypatch.setenv("INFER_DEVICE", "fakeb")
    assert two_accelerators.select().name == "fakeb"
    assert two_accelerators.select("fakea").name == "fakea"  # --device beats the environment
    monkeypatch.setenv("INFER_DEVICE", "cpu")
    assert two_accelerators.select().name == "cpu"


def test_single_accelerator_wins_over_cpu(monkeypatch):
    monkeypatch.delenv("INFER_DEVICE", raising=False)
    host = PluginHost()
    host.add_module(infer_cpu)
    host.add_module(_accelerator("fakea"))
    host.add_module(_accelerator("fakeb", found=False))
    assert host.select().name == "fakea"


def test_cpu_when_no_accelerator_and_reasons_kept(monkeypatch):
    monkeypatch.delenv("INFER_DEVICE", raising=False)
    host = PluginHost()
    host.add_module(infer_cpu)
    host.add_module(_accelerator("fakea", found=False))
    host.add_module(_accelerator("fakeb", raises=True))
    assert host.select().name == "cpu"
    probes = host.probe_all()
    assert probes["fakea"].reason == "no fakea device"
    assert "driver exploded" in probes["fakeb"].reason
    with pytest.raises(PlatformSelectionError, match="no fakea device"):
        host.select("fakea")
    with pytest.raises(PlatformSelectionError, match="installed platforms: cpu, fakea, fakeb"):
        host.select("tpu")


def test_unlisted_flag_reads_not_implemented(monkeypatch):
    monkeypatch.delenv("INFER_DEVICE", raising=False)
    host = PluginHost()
    host.add_module(infer_cpu)
    entry = host.matrix.lookup("cpu", host.select().generation, "--enable-two-batch-overlap")
    assert entry.status is Status.NOT_IMPLEMENTED and entry.reason
