"""infer-plugin-cpu: the CPU platform. Its ops are the plain-torch references of every op.

This module is the entry point: it imports nothing heavy (torch is imported by the factories).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1

# OpenMP threads that spin at barriers stall whenever a peer thread is descheduled: on this shared
# 2-core machine the int4 matmuls of one decode step took 2.4 s with spinning and 22 ms with
# sleeping waits (benchmarks/RESULTS.md). libgomp reads this once, when torch loads it, so it
# must be set before torch is imported (the plugin host loads this module first); a value the
# user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_cpu.probe import create_platform, probe

    register("cpu", probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    here = Path(__file__).parent
    register(here / "support_vendor.yaml")  # generated: what needs other hardware
    register(here / "support.yaml")  # hand-kept: what this plugin implements (wins)


def _torch_native_attention(config: Any) -> Any:
    from infer_cpu.ops.attention import TorchNativeAttention

    return TorchNativeAttention(config)


def _dense_linear(config: Any) -> Any:
    from infer_cpu.ops.linear import DenseLinearMethod

    return DenseLinearMethod(config)


def _gguf_linear(config: Any) -> Any:
    from infer_cpu.quant.methods import GGUFLinearMethod

    return GGUFLinearMethod(config)


def _int8_weight_only_linear(config: Any) -> Any:
    from infer_cpu.quant.methods import Int8WeightOnlyLinearMethod

    return Int8WeightOnlyLinearMethod(config)


def _torch_moe() -> Any:
    from infer_cpu.ops.moe import TorchMoERunner

    return TorchMoERunner()


def _gloo(world_size: int, rank: int) -> Any:
    from infer_cpu.ops.comm import GlooCommunicator

    return GlooCommunicator(world_size, rank)


@hookimpl
def register_attention_backends(register: Any) -> None:
    register("torch_native", _torch_native_attention, "cpu")


@hookimpl
def register_linear_methods(register: Any) -> None:
    register(None, _dense_linear, "cpu")
    register("gguf", _gguf_linear, "cpu")  # GGUF Q4_0/Q4_1/Q8_0 blocks on int4/int8 kernels
    register("torchao:int8wo", _int8_weight_only_linear, "cpu")  # --torchao-config int8wo


def _native_decode_graph(model_runner: Any, server_args: Any) -> Any:
    from infer_cpu.graph import NativeDecodeGraph

    return NativeDecodeGraph(model_runner, server_args)


@hookimpl
def register_graph_runners(register: Any) -> None:
    register("native_decode", _native_decode_graph, "cpu")


@hookimpl
def register_layer_ops(register: Any) -> None:
    for name in ("rms_norm", "rotary", "silu_and_mul"):  # native kernels, torch for the rest
        register(name, f"infer_cpu.ops.layer_ops:{name}", "cpu")


@hookimpl
def register_moe_runners(register: Any) -> None:
    register("torch", _torch_moe, "cpu")
    register("auto", _torch_moe, "cpu")


@hookimpl
def register_communicators(register: Any) -> None:
    register("gloo", _gloo, "cpu")
