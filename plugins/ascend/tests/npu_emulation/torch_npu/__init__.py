"""A plain-torch emulation of the torch_npu calls infer's Ascend plugin makes, for tests on
machines without an NPU. It lives only under plugins/ascend/tests/ and is put on sys.path by
the tests (``npu_emulation.install``); it is never installed with the plugin.

Each op follows its documented semantics (the docstring names the document) and checks its
arguments (layouts, dtypes, host-side lengths), so that a wrong call fails here as it would on
the device. Tensors stay on the host: the emulated device is the CPU.
"""

from __future__ import annotations

import torch

from . import npu
from ._attention import _npu_reshape_and_cache, npu_fused_infer_attention_score
from ._layer import _npu_rotary_embedding, npu_add_rms_norm, npu_rms_norm, npu_swiglu
from ._moe import (
    npu_grouped_matmul,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k_softmax,
    npu_moe_init_routing_v2,
)
from ._moe_dist import install_comm_names, npu_moe_distribute_combine, npu_moe_distribute_dispatch
from ._quant import (
    npu_dynamic_quant,
    npu_quant_matmul,
    npu_quantize,
    npu_trans_quant_param,
    npu_weight_quant_batchmatmul,
)

__version__ = "0.0.0+emulation"
EMULATED = True

__all__ = [
    "_npu_reshape_and_cache", "_npu_rotary_embedding", "npu", "npu_add_rms_norm",
    "npu_dynamic_quant", "npu_fused_infer_attention_score", "npu_grouped_matmul",
    "npu_moe_distribute_combine", "npu_moe_distribute_dispatch", "npu_moe_finalize_routing",
    "npu_moe_gating_top_k_softmax", "npu_moe_init_routing_v2", "npu_quant_matmul", "npu_quantize",
    "npu_rms_norm", "npu_swiglu", "npu_trans_quant_param", "npu_weight_quant_batchmatmul",
]



def _register_hccl() -> None:
    """The "hccl" torch.distributed backend, as importing the real torch_npu registers it; here
    gloo carries it (host tensors), so multi-rank code naming the platform's backend runs."""
    import torch.distributed as dist

    if "hccl" in dist.Backend.backend_list:
        return

    def gloo(store, rank, size, timeout):  # noqa: ANN001, ANN202
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend("hccl", gloo, devices=["cpu"])


torch.npu = npu  # what importing the real torch_npu does
_register_hccl()
install_comm_names()
