"""Rotary position embeddings (rotate-half layout, as in Hugging Face checkpoints).

Supported ``rope_type`` values: default, linear, llama3, yarn, dynamic. The cos/sin table
[max_positions, rotary_dim] is computed once in float32; ``forward`` only gathers rows by
position, so it is free of host syncs.

``dynamic`` (NTK-aware): positions below ``original_max_position_embeddings`` use the unscaled
frequencies (what transformers does while the sequence fits the original window); positions
beyond use the base stretched for the full ``original * factor`` window. transformers instead
re-derives one base per call from the current length, so past the original window the two differ.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from infer.core.ops.layer_ops import REFERENCE_OPS, LayerOps
from torch import nn


def _default_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # [dim/2]


def _llama3_inv_freq(dim: int, base: float, p: dict[str, Any]) -> torch.Tensor:
    inv_freq = _default_inv_freq(dim, base)
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, p: dict[str, Any],
                   max_positions: int) -> tuple[torch.Tensor, float]:
    orig = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_positions / orig
    attn_factor = p.get("attention_factor")
    if attn_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attn_factor = _yarn_mscale(factor, p["mscale"]) / _yarn_mscale(factor, p["mscale_all_dim"])
        else:
            attn_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolate = 1 - ramp  # weight of the unscaled frequency per pair
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(attn_factor)


def rope_table(rotary_dim: int, max_positions: int, params: dict[str, Any]) -> torch.Tensor:
    """cos/sin table [max_positions, rotary_dim]: first half cos, second half sin (each dim/2)."""
    base, kind = float(params["rope_theta"]), params.get("rope_type", "default")
    scale = 1.0
    positions = torch.arange(max_positions, dtype=torch.float32)
    if kind == "default":
        inv_freq = _default_inv_freq(rotary_dim, base)
    elif kind == "linear":
        inv_freq = _default_inv_freq(rotary_dim, base) / params["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(rotary_dim, base, params)
    elif kind == "yarn":
        inv_freq, scale = _yarn_inv_freq(rotary_dim, base, params, max_positions)
    elif kind == "dynamic":
        orig, factor = params["original_max_position_embeddings"], params["factor"]
        long_len = int(orig * factor)
        long_base = base * ((factor * long_len / orig) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        short = positions[:orig, None] * _default_inv_freq(rotary_dim, base)
        long = positions[orig:, None] * _default_inv_freq(rotary_dim, long_base)
        freqs = torch.cat([short, long])
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    else:
        raise ValueError(f"rope_type {kind!r} is not supported (supported: default, linear, "
                         f"llama3, yarn, dynamic)")
    freqs = positions[:, None] * inv_freq[None, :]  # [P, dim/2]
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any],
                 rotary_dim: int | None = None, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        self.register_buffer("cos_sin", rope_table(self.rotary_dim, max_positions, params),
                             persistent=False)  # [P, rotary_dim] float32
        self._op = (ops or REFERENCE_OPS).rotary

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T], q [T, H, D], k [T, Hkv, D] -> rotated q, k (same shapes and dtype)."""
        return self._op(positions, q, k, self.cos_sin, self.rotary_dim)
