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
