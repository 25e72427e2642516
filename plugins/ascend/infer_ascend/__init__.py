"""infer-plugin-ascend: Huawei Ascend NPUs (A2: Atlas 800I/900 A2, A3: Atlas A3 SuperPoD)
through torch_npu.

The entry-point module imports nothing heavy: implementations are registered as
"module:Class" strings and imported (with torch_npu, which needs the CANN toolkit) only when the
core picks them. The probe checks that torch_npu and CANN are installed (without importing
torch_npu), that the driver's device nodes exist, and reads the SoC name from ``npu-smi``, so no
ACL context is created.

What runs (see README.md and support_impl.yaml): attention backend ``ascend``, unquantized /
W8A8 int8 / weight-only int8 linear methods and msModelSlim checkpoints (``modelslim``), the MoE runner, HCCL collectives and ACL-graph
decode, all on torch_npu ops. Verified against an emulation of the ops here, not yet on an NPU,
so the matrix reads experimental for them.
"""

from __future__ import annotations

from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1
PLATFORM = "ascend"


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_ascend.platform import create_platform
    from infer_ascend.probe import probe

    register(PLATFORM, probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    from infer_ascend.support import entries

    gens, rows = entries()
    register(PLATFORM, rows, gens)


@hookimpl
def register_attention_backends(register: Any) -> None:
    register("ascend", "infer_ascend.ops.attention:AscendAttention", PLATFORM)


@hookimpl
def register_linear_methods(register: Any) -> None:
    register(None, "infer_ascend.ops.linear:AscendDenseLinear", PLATFORM)
    register("w8a8_int8", "infer_ascend.ops.linear:w8a8_int8", PLATFORM)
    register("modelslim", "infer_ascend.ops.modelslim:ModelslimLinear", PLATFORM)
    register("torchao:int8wo", "infer_ascend.ops.linear:Int8WeightOnlyLinear", PLATFORM)


@hookimpl
def register_moe_runners(register: Any) -> None:
    register("auto", "infer_ascend.ops.moe:AscendMoERunner", PLATFORM)


@hookimpl
def register_communicators(register: Any) -> None:
    register("hccl", "infer_ascend.ops.comm:HcclCommunicator", PLATFORM)


@hookimpl
def register_graph_runners(register: Any) -> None:
    register("acl_graph", "infer_ascend.graph_runner:AclGraphRunner", PLATFORM)


@hookimpl
def register_layer_ops(register: Any) -> None:
    register("rms_norm", "infer_ascend.ops.layer_ops:rms_norm", PLATFORM)
    register("rotary", "infer_ascend.ops.layer_ops:rotary", PLATFORM)
    register("silu_and_mul", "infer_ascend.ops.layer_ops:silu_and_mul", PLATFORM)
