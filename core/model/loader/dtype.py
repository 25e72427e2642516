"""``--dtype`` with SGLang's meaning: "auto" runs FP32 and FP16 checkpoints in FP16 and BF16
checkpoints in BF16. A GGUF file has no training dtype; its weights are dequantised to FP32, so
"auto" runs it in FP32 (as transformers does when it loads a GGUF)."""

from __future__ import annotations

from typing import Any

import torch

DTYPE_CHOICES = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float": torch.float32, "float32": torch.float32}


def resolve_dtype(dtype: str | torch.dtype, config: Any, *, is_gguf: bool = False) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in DTYPE_CHOICES:
            raise ValueError(f"--dtype {dtype!r} is not one of: auto, {', '.join(DTYPE_CHOICES)}")
        return DTYPE_CHOICES[dtype]
    if is_gguf:
        return torch.float32
    cfg = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(cfg, str):
        cfg = getattr(torch, cfg, None)
    return torch.bfloat16 if cfg == torch.bfloat16 else torch.float16


# --kv-cache-dtype values that store the cache in fp8 (per-tensor scales, 1.0 unless loaded)
FP8_KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
BF16_KV = ("bf16", "bfloat16")


def resolve_kv_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """``--kv-cache-dtype`` -> the cache's storage dtype. "auto" keeps the model dtype
    (``dtype``); "bf16" / "bfloat16" store bf16 whatever the model dtype (SGLang's meaning: a
    float32 model, such as a GGUF file's dequantised weights, keeps bf16 keys and values);
    "fp8_e4m3" / "fp8_e5m2" store fp8 (``fp8`` is aliased to fp8_e4m3 by the flag table before
    this)."""
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype in BF16_KV:
        return torch.bfloat16
    if kv_cache_dtype in FP8_KV_DTYPES:
        return FP8_KV_DTYPES[kv_cache_dtype]
    if kv_cache_dtype == "fp4_e2m1":
        raise NotImplementedError("--kv-cache-dtype fp4_e2m1 is not implemented (no fp4 attention "
                                  "kernels); use --kv-cache-dtype fp8_e4m3 or auto")
    raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of: "
                     f"{', '.join(('auto',) + BF16_KV + tuple(FP8_KV_DTYPES))}, fp4_e2m1")
