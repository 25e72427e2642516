"""infer-plugin-cuda: NVIDIA GPUs. Triton / FlashInfer / torch-native attention, torch and fp8
GEMMs, a Triton fused MoE, CUDA-graph decode, NCCL collectives.

This module is the entry point: it imports nothing heavy (torch, triton and flashinfer are
imported by the factories, when the CUDA platform is actually used).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl

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


def _triton_attention(config: Any) -> Any:
    from infer_cuda.ops.attention_triton import TritonAttention

    return TritonAttention(config)


def _flashinfer_attention(config: Any) -> Any:
    from infer_cuda.ops.attention_flashinfer import FlashInferAttention

    return FlashInferAttention(config)


def _torch_native_attention(config: Any) -> Any:
    from infer_cpu.ops.attention import TorchNativeAttention  # the plain-torch reference

    return TorchNativeAttention(config)


def _dense_linear(config: Any) -> Any:
    from infer_cpu.ops.linear import DenseLinearMethod  # F.linear: cuBLAS on CUDA tensors

    return DenseLinearMethod(config)


def _fp8_linear(config: Any) -> Any:
    from infer_cuda.ops.linear_fp8 import Fp8LinearMethod

    return Fp8LinearMethod(config)


def _triton_moe() -> Any:
    from infer_cuda.ops.moe import TritonMoERunner

    return TritonMoERunner()


def _torch_moe() -> Any:
    from infer_cpu.ops.moe import TorchMoERunner

    return TorchMoERunner()


def _nccl(world_size: int, rank: int) -> Any:
    from infer_cuda.ops.comm import NcclCommunicator

    return NcclCommunicator(world_size, rank)


def _cuda_graph_runner(model_runner: Any, server_args: Any) -> Any:
    from infer_cuda.graph_runner import CudaGraphRunner

    return CudaGraphRunner(model_runner, server_args)


@hookimpl
def register_attention_backends(register: Any) -> None:
    register("triton", _triton_attention, PLATFORM)
    register("torch_native", _torch_native_attention, PLATFORM)
    if importlib.util.find_spec("flashinfer") is not None:
        register("flashinfer", _flashinfer_attention, PLATFORM)


@hookimpl
def register_linear_methods(register: Any) -> None:
    register(None, _dense_linear, PLATFORM)
    register("fp8", _fp8_linear, PLATFORM)


@hookimpl
def register_moe_runners(register: Any) -> None:
    register("triton", _triton_moe, PLATFORM)
    register("auto", _triton_moe, PLATFORM)
    register("torch", _torch_moe, PLATFORM)


@hookimpl
def register_communicators(register: Any) -> None:
    register("nccl", _nccl, PLATFORM)


@hookimpl
def register_graph_runners(register: Any) -> None:
    register("cuda_graph", _cuda_graph_runner, PLATFORM)
