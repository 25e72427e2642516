"""infer's rotary tables against transformers' own rope initialisation functions."""

from __future__ import annotations

import pytest
import torch
from infer.core.model.arch import rope_parameters
from infer.core.model.layers.rotary import rope_table
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128},
    "yarn": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
             "original_max_position_embeddings": 128},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
}


@pytest.mark.parametrize("kind", list(CASES))
def test_table_matches_transformers(kind):
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=512,
                      rope_parameters=dict(CASES[kind]))
    params = rope_parameters(cfg)
    if kind == "dynamic":
        params.setdefault("original_max_position_embeddings", 512)
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu") if kind != "default" else \
        (1.0 / (params["rope_theta"] ** (torch.arange(0, 64, 2).float() / 64)), 1.0)
    n = 512  # for dynamic: within the original window, where transformers keeps the base
    freqs = torch.arange(n).float()[:, None] * inv_freq[None, :]
    ref = torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)
    torch.testing.assert_close(rope_table(64, n, params), ref, rtol=1e-6, atol=1e-6)
