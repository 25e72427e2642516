"""Default sampling parameters: --sampling-defaults model (the model's generation_config.json,
SGLang's default) or openai (SamplingParams' own defaults: temperature 1, top_p 1, ...)."""

from __future__ import annotations

from typing import Any

SAMPLING_DEFAULTS = ("model", "openai")
_FROM_MODEL = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(mode: str, generation_config: Any) -> dict[str, Any]:
    """Field defaults to merge under each request's own sampling params."""
    if mode not in SAMPLING_DEFAULTS:
        raise ValueError(f"sampling_defaults: must be one of {SAMPLING_DEFAULTS}, got {mode!r}")
    if mode == "openai" or generation_config is None:
        return {}
    get = generation_config.get if isinstance(generation_config, dict) else \
        (lambda k: getattr(generation_config, k, None))
    out = {}
    for key in _FROM_MODEL:
        value = get(key)
        if value is not None:
            out[key] = int(value) if key == "top_k" else float(value)
    if out.get("top_k") == 0:
        out["top_k"] = -1  # transformers' "disabled"
    return out
