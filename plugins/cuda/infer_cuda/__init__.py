"""infer-plugin-cuda: NVIDIA GPUs. Triton / FlashInfer / torch-native attention, torch and fp8
GEMMs, a Triton fused MoE, CUDA-graph decode, NCCL collectives.

This module is the entry point: it imports nothing heavy (torch, triton and flashinfer are
imported when the core picks an implementation: they are registered as "module:Class" strings).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl
from infer.core.ops import reference

INFER_API_VERSION = 1
PLATFORM = "cuda"


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_cuda.platform import create_platform
    from infer_cuda.probe import probe

    register(PLATFORM, probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    register(Path(__file__).with_name("support.yaml"))


@hookimpl
def register_attention_backends(register: Any) -> None:
    register("triton", "infer_cuda.ops.attention_triton:TritonAttention", PLATFORM)
    register("torch_native", reference.ATTENTION, PLATFORM)  # the core's plain-torch reference
    if importlib.util.find_spec("flashinfer") is not None:
        register("flashinfer", "infer_cuda.ops.attention_flashinfer:FlashInferAttention", PLATFORM)


@hookimpl
def register_linear_methods(register: Any) -> None:
    register(None, "infer_cuda.ops.linear_dense:CudaDenseLinearMethod", PLATFORM)  # cuBLAS / GEMV
    register("fp8", "infer_cuda.ops.linear_fp8:Fp8LinearMethod", PLATFORM)


@hookimpl
def register_moe_runners(register: Any) -> None:
    register("triton", "infer_cuda.ops.moe:TritonMoERunner", PLATFORM)
    register("auto", "infer_cuda.ops.moe:TritonMoERunner", PLATFORM)
    register("torch", reference.MOE, PLATFORM)


@hookimpl
def register_communicators(register: Any) -> None:
    register("nccl", "infer_cuda.ops.comm:NcclCommunicator", PLATFORM)


@hookimpl
def register_graph_runners(register: Any) -> None:
    register("cuda_graph", "infer_cuda.graph_runner:CudaGraphRunner", PLATFORM)
