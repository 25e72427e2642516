"""Loader paths: load formats (safetensors, pt, dummy), Hugging Face repo ids through a local hub
cache (offline, with --revision), dtype resolution, and the clear errors for bad settings."""

from __future__ import annotations

import shutil

import pytest
import torch
from infer.core.model.loader import UnknownArchitectureError, load_model
from infer.core.model.loader.dtype import resolve_dtype
from infer.core.model.loader.source import ModelSourceError

from .driver import PagedDriver
from .hf_tiny import save_tiny

PROMPT = [3, 14, 15, 92, 65, 35, 8, 9]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = save_tiny("llama_tied", path)
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    return path, hf, ref


def _logits(loaded):
    return PagedDriver(loaded, 2).step([(0, PROMPT)])[0]


def _load(path, host, cpu, **kw):
    kw.setdefault("dtype", "float32")
    return load_model(str(path), platform=cpu, host=host, skip_tokenizer_init=True,
                      progress=False, **kw)


def test_pt_format_matches_safetensors(tiny_llama, host, cpu, tmp_path):
    path, hf, ref = tiny_llama
    hf.save_pretrained(tmp_path, safe_serialization=False)
    if not list(tmp_path.glob("*.bin")):  # transformers >= 5 writes safetensors regardless
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
        for f in tmp_path.glob("*.safetensors"):
            f.unlink()
    loaded = _load(tmp_path, host, cpu, load_format="pt")
    assert loaded.source.load_format == "pt"
    torch.testing.assert_close(_logits(loaded), ref, rtol=1e-4, atol=1e-4)
    auto = _load(tmp_path, host, cpu)  # auto falls back to pt when there is no safetensors
    assert auto.source.load_format == "pt"


def test_dummy_format_runs_from_config_alone(tiny_llama, host, cpu, tmp_path):
    path, _, ref = tiny_llama
    shutil.copy(path / "config.json", tmp_path / "config.json")
    loaded = _load(tmp_path, host, cpu, load_format="dummy")
    out = _logits(loaded)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert not torch.allclose(out, ref)


def test_hub_repo_id_from_local_cache(tiny_llama, host, cpu, tmp_path, monkeypatch):
    """A repo id resolved through huggingface_hub's cache layout, offline; --revision picks the
    snapshot."""
    import huggingface_hub.constants as hc

    path, _, ref = tiny_llama
    repo = tmp_path / "models--acme--tiny-llama"
    for sha, src in (("a" * 40, path), ("b" * 40, None)):
        snap = repo / "snapshots" / sha
        snap.mkdir(parents=True)
        shutil.copy(path / "config.json", snap / "config.json")
        if src is not None:
            shutil.copy(path / "model.safetensors", snap / "model.safetensors")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    loaded = _load("acme/tiny-llama", host, cpu)
    assert loaded.source.directory.name == "a" * 40
    torch.testing.assert_close(_logits(loaded), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ModelSourceError, match="no safetensors / pt / gguf weights"):
        _load("acme/tiny-llama", host, cpu, revision="b" * 40)
    with pytest.raises(ModelSourceError, match="not in the Hugging Face cache"):
        _load("acme/absent", host, cpu)


@pytest.mark.parametrize("dtype,torch_dtype", [("bfloat16", torch.bfloat16), ("half", torch.float16),
                                               ("float16", torch.float16)])
def test_half_precision_close_to_float32(tiny_llama, host, cpu, dtype, torch_dtype):
    path, _, ref = tiny_llama
    loaded = _load(path, host, cpu, dtype=dtype)
    assert loaded.model.model.embed_tokens.weight.dtype == torch_dtype == loaded.arch.kv_dtype
    out = _logits(loaded)
    assert out.dtype == torch.float32
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 5e-2


def test_resolve_dtype_follows_sglang_auto():
    class Cfg:
        dtype = None

    cfg = Cfg()
    for stored, expect in ((torch.float32, torch.float16), (torch.float16, torch.float16),
                           ("bfloat16", torch.bfloat16), (None, torch.float16)):
        cfg.dtype = stored
        assert resolve_dtype("auto", cfg) == expect
    assert resolve_dtype("auto", cfg, is_gguf=True) == torch.float32
    assert resolve_dtype("half", cfg) == torch.float16
    assert resolve_dtype("float", cfg) == torch.float32
    with pytest.raises(ValueError, match="--dtype 'fp8'"):
        resolve_dtype("fp8", cfg)


def test_clear_errors(tiny_llama, host, cpu, tmp_path):
    path, _, _ = tiny_llama
    with pytest.raises(ValueError, match="--attention-backend flashinfer.*available: torch_native"):
        _load(path, host, cpu, attention_backend="flashinfer")
    with pytest.raises(ValueError, match="--moe-runner-backend triton.*available:"):
        _load(path, host, cpu, moe_runner_backend="triton")
    with pytest.raises(NotImplementedError, match="--model-impl transformers"):
        _load(path, host, cpu, model_impl="transformers")
    with pytest.raises(ModelSourceError, match="--load-format 'npcache'"):
        _load(path, host, cpu, load_format="npcache")
    with pytest.raises(ModelSourceError, match="no gguf weights"):
        _load(path, host, cpu, load_format="gguf")
    with pytest.raises(ModelSourceError, match="neither an existing file"):
        _load(tmp_path / "missing", host, cpu)
    cfg = (path / "config.json").read_text().replace("LlamaForCausalLM", "FancyNetForCausalLM")
    (tmp_path / "config.json").write_text(cfg)
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(UnknownArchitectureError, match="FancyNet.*supported: LlamaForCausalLM"):
        _load(tmp_path, host, cpu)
