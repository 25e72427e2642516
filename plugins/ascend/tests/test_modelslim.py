"""``--quantization modelslim``: a tiny Qwen2 (q/k/v biases) quantized here into msModelSlim's
layout (quant_model_description.json + quant_model_weights.safetensors, the tensors and formulas
of msModelSlim's quantized-weight-format document), with a different scheme on each layer
(W8A8 static with calibrated asymmetric activation scales, W8A8_DYNAMIC, W8A16 with asymmetric
weights, FLOAT), loaded on the Ascend platform and run through prefill and decode; its logits
against the same model with every weight dequantised, loaded unquantized. A checkpoint whose
offsets are written with the opposite sign convention must miss that reference (the
comparison can fail), and ``w8a8_int8`` on the same checkpoint is the same method."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from infer.core.model.loader import load_model

from .hf_models import hf_tiny
from .modelslim_ckpt import calibrate, write_modelslim
from .paged_driver import PAGE, Pages

pytestmark = pytest.mark.usefixtures("npu_emulation")

# 8-bit activations vs the dequantised float model, of the largest logit (measured here: 0.03
# mixed, 0.05 all-static, 0.02 all-dynamic; with the offsets' sign flipped: 1.46)
TOL = 0.08


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    src = tmp_path_factory.mktemp("qwen2")
    hf = hf_tiny.save_tiny("qwen2", src, initializer_range=0.05)  # real-model scale
    gen = torch.Generator().manual_seed(5)
    calib = calibrate(hf, torch.randint(0, 97, (2, 64), generator=gen))
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (40, 7)]
    return hf, src, calib, prompts


def _logits(path: Path, ascend, device, dtype: str, quantization: str | None, prompts):
    """Logits of a prefill of two prompts, then three decode steps of both."""
    from infer.core.plugins import get_plugin_host

    loaded = load_model(str(path), platform=ascend, host=get_plugin_host(), dtype=dtype,
                        quantization=quantization, page_size=PAGE, skip_tokenizer_init=True,
                        progress=False)
    pages = Pages(loaded, device)
    steps = [pages.step([("a", prompts[0]), ("b", prompts[1])])]
    for t in range(3):
        steps.append(pages.step([("a", [t + 1]), ("b", [t + 2])]))
    return loaded, torch.cat([torch.cat(s) for s in steps]).float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_modelslim_checkpoint_matches_its_dequantised_model(model, ascend, device, tmp_path,
                                                            dtype):
    hf, src, calib, prompts = model
    tdtype = getattr(torch, dtype)
    ckpt = write_modelslim(hf, src, tmp_path / "ms", tdtype, calib)
    loaded, got = _logits(ckpt, ascend, device, dtype, "modelslim", prompts)
    layers = loaded.model.model.layers
    assert [layers[0].self_attn.qkv_proj.modelslim_scheme, layers[0].mlp.gate_up_proj.modelslim_scheme,
            layers[1].mlp.down_proj.modelslim_scheme] == ["W8A8", "W8A16", "FLOAT"]
    assert len(layers[0].self_attn.qkv_proj.ms_groups) == 2  # q,k share a scale; v has its own
    assert layers[0].self_attn.qkv_proj.weight.dtype == torch.int8
    _, want = _logits(ckpt / "ref", ascend, device, dtype, None, prompts)
    assert _rel(got, want) < TOL
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    _, alias = _logits(ckpt, ascend, device, dtype, "w8a8_int8", prompts)
    assert torch.equal(alias, got)


def test_wrong_offset_sign_misses_the_reference(model, ascend, device, tmp_path):
    hf, src, calib, prompts = model
    good = write_modelslim(hf, src, tmp_path / "ms", torch.bfloat16, calib)
    bad = write_modelslim(hf, src, tmp_path / "flipped", torch.bfloat16, calib,
                          flip_offsets=True)
    _, want = _logits(good / "ref", ascend, device, "bfloat16", None, prompts)
    _, got = _logits(bad, ascend, device, "bfloat16", "modelslim", prompts)
    assert _rel(got, want) > 3 * TOL


def test_refusals(model, ascend, tmp_path):
    from infer.core.plugins import get_plugin_host

    hf, src, calib, _ = model

    def load(path: Path) -> None:
        load_model(str(path), platform=ascend, host=get_plugin_host(), dtype="float16",
                   quantization="modelslim", page_size=PAGE, skip_tokenizer_init=True,
                   progress=False)

    with pytest.raises(ValueError, match="quant_model_description.json"):
        load(src)
    ckpt = write_modelslim(hf, src, tmp_path / "ms", torch.float16, calib)
    desc = json.loads((ckpt / "quant_model_description.json").read_text())
    desc["model.layers.1.self_attn.k_proj.weight"] = "W8A8"  # q/v stay W8A16
    (ckpt / "quant_model_description.json").write_text(json.dumps(desc))
    with pytest.raises(ValueError, match="quantized differently"):
        load(ckpt)
    desc["model.layers.1.self_attn.k_proj.weight"] = "W8A16"
    desc["lm_head.weight"] = "W8A8_DYNAMIC"
    (ckpt / "quant_model_description.json").write_text(json.dumps(desc))
    with pytest.raises(NotImplementedError, match="lm_head"):
        load(ckpt)
    desc["lm_head.weight"] = "FLOAT"
    desc["model.layers.0.input_layernorm.bias"] = "W8A8"  # anti-outlier's norm bias
    (ckpt / "quant_model_description.json").write_text(json.dumps(desc))
    with pytest.raises(NotImplementedError, match="anti-outlier"):
        load(ckpt)
