"""A msModelSlim checkpoint written from a float Hugging Face model, for the tests
(test_modelslim.py, test_parallel.py): the layout and formulas of msModelSlim's
quantized-weight-format document (quant_model_description.json + quant_model_weights.safetensors),
a different scheme on each layer, and beside it (in 'ref') the same model with every weight
dequantised, as a float checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

# layer -> projection -> scheme (q/k/v and gate/up share one: infer runs them merged)
SCHEMES = [
    {"q_proj": "W8A8", "k_proj": "W8A8", "v_proj": "W8A8", "o_proj": "W8A8_DYNAMIC",
     "gate_proj": "W8A16", "up_proj": "W8A16", "down_proj": "W8A8"},
    {"q_proj": "W8A16", "k_proj": "W8A16", "v_proj": "W8A16", "o_proj": "W8A8",
     "gate_proj": "W8A8_DYNAMIC", "up_proj": "W8A8_DYNAMIC", "down_proj": "FLOAT"},
]


def calibrate(hf, tokens: torch.Tensor) -> dict[str, tuple[float, float]]:
    """min / max of every linear layer's input over a calibration batch (what msModelSlim's
    static W8A8 calibration observes)."""
    seen: dict[str, tuple[float, float]] = {}
    hooks = [m.register_forward_hook(
        lambda mod, inp, out, name=name: seen.__setitem__(
            name, (inp[0].min().item(), inp[0].max().item())))
        for name, m in hf.named_modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        hf(tokens)
    for h in hooks:
        h.remove()
    return seen


def _int64_bits(scale: torch.Tensor) -> torch.Tensor:
    """modelslim's deq_scale for float16 models: float32 bits widened to int64."""
    return torch.from_numpy(scale.float().numpy().view(np.int32).astype(np.int64))


def write_modelslim(hf, src: Path, dst: Path, dtype: torch.dtype, calib: dict,
                    flip_offsets: bool = False) -> Path:
    """Quantize ``hf``'s linear layers per SCHEMES into dst (modelslim's layout) and write the
    dequantised float model to dst/'ref'. ``flip_offsets`` writes input/weight offsets with the
    wrong sign (a checkpoint the reference must not match)."""
    sd = {k: v.float() for k, v in hf.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    desc: dict[str, str] = {"model_quant_type": "W8A8"}
    ref = dict(sd)
    sign = -1.0 if flip_offsets else 1.0
    for name, w in sd.items():
        parts = name.split(".")
        proj = parts[-2] if len(parts) > 4 and parts[1] == "layers" else None
        scheme = SCHEMES[int(parts[2])][proj] if proj in SCHEMES[0] else "FLOAT"
        prefix = name.rsplit(".", 1)[0]
        if scheme == "FLOAT" or not name.endswith(".weight"):
            if not (name.endswith(".bias") and scheme == "W8A8"):
                out[name], desc[name] = w.to(dtype), "FLOAT" if scheme == "FLOAT" else scheme
            continue
        if scheme in ("W8A8", "W8A8_DYNAMIC"):  # symmetric per output channel
            ws = w.abs().amax(1) / 127.0
            q = torch.round(w / ws[:, None]).clamp(-127, 127)
            ref[name] = q * ws[:, None]
            out[name] = q.to(torch.int8)
        if scheme == "W8A8_DYNAMIC":
            out[f"{prefix}.weight_scale"] = ws[:, None]
            out[f"{prefix}.weight_offset"] = torch.zeros_like(ws)[:, None]
        elif scheme == "W8A16":  # asymmetric per output channel: w = (q - offset) * scale
            lo, hi = w.amin(1), w.amax(1)
            ws = (hi - lo) / 255.0
            off = torch.round(-128.0 - lo / ws)
            q = torch.round(w / ws[:, None] + off[:, None]).clamp(-128, 127)
            ref[name] = (q - off[:, None]) * ws[:, None]
            out[name] = q.to(torch.int8)
            out[f"{prefix}.weight_scale"] = ws[:, None]
            out[f"{prefix}.weight_offset"] = sign * off[:, None]
        elif scheme == "W8A8":  # static asymmetric activations: x_q = x / s + o
            lo, hi = calib[prefix]
            s = (hi - lo) / 255.0 * (1.5 if proj == "v_proj" else 1.0)  # v: its own scale
            o = round(-128.0 - lo / s)
            deq = ws * s
            bias = sd.get(f"{prefix}.bias", torch.zeros_like(ws))
            qbias = torch.round(bias / deq) - o * q.sum(1)  # bias and offset folded in
            out[f"{prefix}.input_scale"] = torch.tensor([s], dtype=dtype)
            out[f"{prefix}.input_offset"] = torch.tensor([sign * o], dtype=dtype)
            out[f"{prefix}.deq_scale"] = (_int64_bits(deq) if dtype == torch.float16
                                          else deq.float())
            out[f"{prefix}.quant_bias"] = qbias.to(torch.int32)
        for key in out:
            if key.startswith(prefix + ".") and key not in desc:
                desc[key] = scheme
    dst.mkdir()
    save_file({k: v.contiguous() for k, v in out.items()}, dst / "quant_model_weights.safetensors")
    (dst / "quant_model_description.json").write_text(json.dumps(desc, indent=1))
    (dst / "config.json").write_text((src / "config.json").read_text())
    (dst / "ref").mkdir()
    save_file({k: v.contiguous() for k, v in ref.items()}, dst / "ref" / "model.safetensors")
    (dst / "ref" / "config.json").write_text((src / "config.json").read_text())
    return dst
