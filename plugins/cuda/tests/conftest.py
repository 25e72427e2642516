"""Test set-up for the CUDA plugin.

- The shared helpers (kernel_utils, engine_utils) are importable under importlib mode.
- Without a CUDA GPU the Triton kernels run on Triton's CPU interpreter, so CI checks every kernel
  against its reference. TRITON_INTERPRET must be set before any kernel module is imported
  (``@triton.jit`` reads it when the kernel is defined); an explicit value is kept.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
