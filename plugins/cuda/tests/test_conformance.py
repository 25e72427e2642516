"""The conformance kit (infer.core.testing) over every op registered for the CUDA platform.

On a GPU: every attention backend, linear method, MoE runner, communicator and graph runner the
plugin registers, on the device (and fp8 KV caches where the matrix runs them). Without one, the
Triton attention backend, the linear methods (the GEMV path and fp8) and the MoE runner run on the
CPU under Triton's interpreter (conftest sets TRITON_INTERPRET=1), which rounds float32 to bf16 by
truncation, so the bf16 bound is the interpreter's (kernel_utils.bf16_tol)."""

from __future__ import annotations

import pytest
import torch
from infer.core.testing import Tolerances, conformance_test
from kernel_utils import HAS_GPU, INTERPRET, bf16_tol

test_cuda_conformance = conformance_test("cuda", marks=(pytest.mark.gpu,))

if not HAS_GPU and INTERPRET:
    test_cuda_kernels_interpreted = conformance_test(
        "cuda", device="cpu", kinds=("attention", "linear", "moe"), dtypes=(torch.float32, torch.bfloat16),
        tolerances=Tolerances(bfloat16=bf16_tol()))
