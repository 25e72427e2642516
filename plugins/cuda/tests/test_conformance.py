"""The conformance kit (infer.core.testing) over every op registered for the CUDA platform.

On a GPU: every attention backend, linear method, MoE runner, communicator and graph runner the
plugin registers, on the device (and fp8 KV caches where the matrix runs them). Without one, the
Triton attention backend, the linear methods (the GEMV path and fp8) and the MoE runner run on the
CPU under Triton's interpreter (conftest sets TRITON_INTERPRET=1), which rounds float32 to bf16 by
truncation, so the bf16 bound is the interpreter's (kernel_utils.bf16_tol).

Interpreted, one attention configuration takes about 15 s on a 2-core machine (every scenario of
the kit, each also with fused rotary), so attention runs each dtype once and each page size once:
float32 (the tight bound) with 16-token pages (sequences across page boundaries, offsets within a
page) and bf16 with 1-token pages (every token its own page), rather than the four products.
test_backends.py still crosses both dtypes with pages of 1, 4 and 16 on its own batches."""

from __future__ import annotations

import pytest
import torch
from infer.core.testing import Tolerances, conformance_test
from infer.core.testing.conformance import KINDS
from kernel_utils import HAS_GPU, INTERPRET, bf16_tol

# On a GPU every attention configuration is a fresh Triton compile (session 20: the whole attention
# case outran 360 s), so attention is split by dtype and page size into tests of their own, which
# `pytest -n` (device_run.sh's PYTEST_ARGS) compiles in parallel; together they are the default
# cross product (float32 and bf16, pages of 1 and 16, each with the matrix's fp8 caches).
_GPU = (pytest.mark.gpu,)
test_cuda_conformance = conformance_test(
    "cuda", kinds=tuple(k for k in KINDS if k != "attention"), marks=_GPU)
test_cuda_attention_f32_page1 = conformance_test(
    "cuda", kinds=("attention",), dtypes=(torch.float32,), page_sizes=(1,), marks=_GPU)
test_cuda_attention_f32_page16 = conformance_test(
    "cuda", kinds=("attention",), dtypes=(torch.float32,), page_sizes=(16,), marks=_GPU)
test_cuda_attention_bf16_page1 = conformance_test(
    "cuda", kinds=("attention",), dtypes=(torch.bfloat16,), page_sizes=(1,), marks=_GPU)
test_cuda_attention_bf16_page16 = conformance_test(
    "cuda", kinds=("attention",), dtypes=(torch.bfloat16,), page_sizes=(16,), marks=_GPU)

if not HAS_GPU and INTERPRET:
    _interpreted = {"device": "cpu", "tolerances": Tolerances(bfloat16=bf16_tol())}
    test_cuda_kernels_interpreted = conformance_test(
        "cuda", kinds=("linear", "moe"), dtypes=(torch.float32, torch.bfloat16), **_interpreted)
    test_cuda_attention_interpreted_f32 = conformance_test(
        "cuda", kinds=("attention",), dtypes=(torch.float32,), page_sizes=(16,), **_interpreted)
    test_cuda_attention_interpreted_bf16 = conformance_test(
        "cuda", kinds=("attention",), dtypes=(torch.bfloat16,), page_sizes=(1,), **_interpreted)
