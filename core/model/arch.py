"""ModelArch: the shape facts of a loaded model that the engine sizes its KV cache from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ModelArch:
    architecture: str  # config.architectures[0], e.g. "LlamaForCausalLM"
    num_layers: int
    num_heads: int  # query heads (whole model, before tensor parallelism)
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    context_length: int  # longest sequence (prompt + output) the model is run with
    dtype: torch.dtype  # weights and activations
    kv_dtype: torch.dtype  # KV cache storage

    @classmethod
    def from_hf_config(cls, config: Any, *, dtype: torch.dtype, context_length: int | None = None,
                       kv_dtype: torch.dtype | None = None) -> ModelArch:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            architecture=(getattr(config, "architectures", None) or ["?"])[0],
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            context_length=context_length or config_context_length(config),
            dtype=dtype,
            kv_dtype=kv_dtype or dtype,
        )


def config_context_length(config: Any) -> int:
    """The model's own maximum context: max_position_embeddings (scaled by a rope factor where
    the scaling type extends it), else 2048."""
    length = getattr(config, "max_position_embeddings", None) or 2048
    rope = rope_parameters(config)
    if rope.get("rope_type") in ("yarn", "dynamic", "linear") and "original_max_position_embeddings" in rope:
        length = max(length, int(rope["original_max_position_embeddings"] * rope.get("factor", 1.0)))
    return int(length)


def rope_parameters(config: Any) -> dict[str, Any]:
    """Rotary settings as one dict (``rope_type``, ``rope_theta``, scaling keys), whether the
    config uses transformers 5's ``rope_parameters`` or the older ``rope_scaling``/``rope_theta``."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = getattr(config, "rope_scaling", None)
    if isinstance(legacy, dict):
        for key, value in legacy.items():
            params.setdefault(key, value)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params
