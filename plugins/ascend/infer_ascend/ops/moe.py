"""MoE runner on torch_npu's routing ops and grouped matmul.

Weights: the core's layer holds w13 [E, 2I, D] (gate rows then up rows) and w2 [E, D, I]; the
grouped matmul takes [E, K, N], so the runner lays them out once as w13^T [E, D, 2I] and
w2^T [E, I, D] (contiguous copies, kept beside the parameters, made on first use since the core
gives MoE runners no load hook) and never transposes per call.

One step, T tokens routed to k experts each (topk_ids [T, k], weights [T, k]):
  1. ``npu_moe_init_routing_v2``: the T*k (token, k) pairs sorted by expert, rows gathered
     (expanded_x [T*k, D]), per-expert row counts (expert_tokens_num_type 1), and the gather
     index expanded_row_idx[t*k + j] = row of pair (t, j) (row_idx_type 0).
  2. ``npu_grouped_matmul`` with the counts as group_list (group_list_type 1): [T*k, 2I].
  3. ``npu_swiglu`` -> [T*k, I]; grouped matmul with w2^T -> [T*k, D].
  4. ``npu_moe_finalize_routing`` (drop_pad_mode 2: the index is row-major, t*k + j): the
     weighted sum of each token's k rows.

Routing: ``select_experts`` is softmax top-k routing on ``npu_moe_gating_top_k_softmax`` (with the
k weights renormalised to sum to 1 when the model asks). It overrides the core's optional
``MoERunner.select_experts`` hook, through which the core's MoE layer (core/model/layers/moe.py)
routes every token; it is checked against the core's ``softmax_topk`` in tests/test_ops.py and
counted per routed row in tests/test_models_vs_hf.py.

Expert parallelism is the core's MoE layer's (core/model/layers/moe.py): with ep > 1 it hands
this runner the assignments routed to this rank's experts (local ids, k = 1) and all-reduces the
partial outputs through the platform's communicator (HCCL here).
"""

from __future__ import annotations

import torch
import torch_npu
from infer.core.ops.moe import MoERunner


def kn_layout(w: torch.Tensor) -> torch.Tensor:
    """[E, N, K] (the layer's layout) -> contiguous [E, K, N], made once per weight tensor and
    kept on it (the core's MoE layer keeps the parameter; nothing transposes per call)."""
    hit = w.__dict__.get("_ascend_kn")
    if hit is None:
        hit = w.__dict__["_ascend_kn"] = w.detach().transpose(1, 2).contiguous()
    return hit


class AscendMoERunner(MoERunner):
    name = "ascend"

    def apply(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, D]; topk ids index the experts of w13 [E, 2I, D] / w2 [E, D, I]."""
        t, k = topk_ids.shape
        experts = w13.shape[0]
        ids = topk_ids.to(torch.int32)
        xs, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
            hidden, ids, active_num=t * k, expert_num=experts, expert_tokens_num_type=1,
            expert_tokens_num_flag=True, active_expert_range=[0, experts], quant_mode=-1,
            row_idx_type=0)
        gate_up = torch_npu.npu_grouped_matmul(
            [xs], [kn_layout(w13)], group_list=counts, split_item=2, group_type=0,
            group_list_type=1)[0]  # [T*k, 2I]
        act = torch_npu.npu_swiglu(gate_up, dim=-1)  # [T*k, I]
        down = torch_npu.npu_grouped_matmul(
            [act], [kn_layout(w2)], group_list=counts, split_item=2, group_type=0,
            group_list_type=1)[0]  # [T*k, D]
        return torch_npu.npu_moe_finalize_routing(
            down, None, None, None, topk_weights.to(down.dtype), row_idx, ids, drop_pad_mode=2)

    def select_experts(self, router_logits: torch.Tensor, top_k: int,
                       renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E] -> (weights float32 [T, k], expert ids int32 [T, k]): softmax,
        top k, optionally renormalised (Mixtral; Qwen3-MoE with norm_topk_prob)."""
        weights, ids, _ = torch_npu.npu_moe_gating_top_k_softmax(router_logits, None, k=top_k)
        weights = weights.float()
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids
