"""infer-plugin-cpu: the CPU platform. It runs the core's plain-torch reference ops
(``infer.core.ops.reference``) and, where they fit, its own native kernels (GGUF blocks, paged
decode attention, fused layer ops, a decode graph).

This module is the entry point: it imports nothing heavy. Implementations are registered as
"module:Class" strings, imported (with torch) only when the core picks them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl
from infer.core.ops import reference

INFER_API_VERSION = 1

# OpenMP threads that spin at barriers stall whenever a peer thread is descheduled: on this shared
# 2-core machine the int4 matmuls of one decode step took 2.4 s with spinning and 22 ms with
# sleeping waits (benchmarks/RESULTS.md). libgomp reads this once, when torch loads it, so it
# must be set before torch is imported: this takes effect where the plugin host loads first (the
# server's engine process inherits it); the `infer` command line sets the same default at start
# for the commands that run an engine in-process. A value the user set wins.
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


@hookimpl
def register_attention_backends(register: Any) -> None:
    # the core's reference with the native paged-decode kernel for float32 caches
    register("torch_native", "infer_cpu.ops.attention:TorchNativeAttention", "cpu")


@hookimpl
def register_linear_methods(register: Any) -> None:
    # bf16 weights on the native bf16 GEMM; the reference DenseLinearMethod otherwise
    register(None, "infer_cpu.ops.linear_native:NativeDenseLinearMethod", "cpu")
    # GGUF Q4_0/Q4_1/Q8_0 blocks on the native kernels (torch's int4/int8 without them)
    register("gguf", "infer_cpu.quant.methods:GGUFLinearMethod", "cpu")
    # --torchao-config int8wo
    register("torchao:int8wo", "infer_cpu.quant.methods:Int8WeightOnlyLinearMethod", "cpu")


@hookimpl
def register_graph_runners(register: Any) -> None:
    register("native_decode", "infer_cpu.graph:NativeDecodeGraph", "cpu")


@hookimpl
def register_layer_ops(register: Any) -> None:
    # native kernels for the float32 and bf16 inputs they fit (infer_cpu.kernels for float32,
    # infer_cpu.kernels.bf16 for bf16); they return None otherwise (torch runs)
    register("rms_norm", "infer_cpu.kernels.bf16:rms_norm", "cpu")
    register("rotary", "infer_cpu.kernels.bf16:rope_", "cpu")
    register("silu_and_mul", "infer_cpu.kernels.bf16:silu_mul", "cpu")
    register("residual_add", "infer_cpu.kernels.bf16:residual_add", "cpu")


@hookimpl
def register_moe_runners(register: Any) -> None:
    register("torch", reference.MOE, "cpu")
    register("auto", reference.MOE, "cpu")


@hookimpl
def register_communicators(register: Any) -> None:
    # gloo, with all-reduce / all-gather through shared memory for ranks on this host (x86-64)
    register("gloo", "infer_cpu.ops.shm_comm:ShmCommunicator", "cpu")
