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

Expert parallelism (ep > 1) takes one of two paths, chosen per layer and batch size by
``dispatches`` (the core's optional hook) and logged once per reason:
  * MC2 (``npu_moe_distribute_dispatch`` / ``npu_moe_distribute_combine``) where the documents
    of both ops allow it (op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch.md and
    _combine.md): an A3 chip; the expert-parallel group is the whole tensor-parallel group (ep ==
    tp, so each rank holds whole experts: the ops have no TP domain here); ep_world_size one of
    8, 16, 32, 64, 128, 144, 256, 288; hidden size 7168; experts in [1, 512] and divisible by ep;
    0 < top_k <= 8; 0 < tokens per rank <= 512; float16/bfloat16. Each rank dispatches its share
    of the tokens, computes its experts' rows with the grouped matmuls (the dispatch's per-expert
    counts as group list), and combine returns the weighted sums. The ops run on their own HCCL
    group (the documents allow no other op on it), made once over the tensor-parallel ranks.
  * Otherwise, and always on A2 (whose MC2 form differs: ep 16-64, extra communication offsets
    in ep_recv_counts), the core's all-gather path: the layer hands this runner the assignments
    routed to this rank's experts (local ids, k = 1) and all-reduces the partial outputs through
    the platform's communicator (HCCL here).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch_npu
from infer.core.ops.moe import MoERunner

log = logging.getLogger(__name__)

MC2_EP_SIZES = (8, 16, 32, 64, 128, 144, 256, 288)  # A3, both documents
MC2_HIDDEN = 7168  # A3: "only 7168"
MC2_MAX_TOKENS = 512  # A3: 0 < BS <= 512 per rank
MC2_MAX_TOP_K = 8  # A3: 0 < K <= 8
MC2_MAX_EXPERTS = 512


def kn_layout(w: torch.Tensor) -> torch.Tensor:
    """[E, N, K] (the layer's layout) -> contiguous [E, K, N], made once per weight tensor and
    kept on it (the core's MoE layer keeps the parameter; nothing transposes per call)."""
    hit = w.__dict__.get("_ascend_kn")
    if hit is None:
        hit = w.__dict__["_ascend_kn"] = w.detach().transpose(1, 2).contiguous()
    return hit


def mc2_refusal(generation: str | None, layer: Any, tokens_per_rank: int) -> str | None:
    """Why MC2 dispatch/combine cannot run ``layer`` (a core SparseMoE) for ``tokens_per_rank``
    tokens per rank, or None when every documented condition holds."""
    ep, experts = layer.ep_size, layer.num_experts
    hidden = layer.w13.shape[2]
    if generation != "A3":
        return f"MC2 dispatch/combine runs on A3 only (this chip: {generation})"
    if ep != layer.tp_size:
        return f"MC2 needs ep == tp (whole experts per rank), got ep={ep}, tp={layer.tp_size}"
    if ep not in MC2_EP_SIZES:
        return f"MC2 on A3 needs ep_world_size in {MC2_EP_SIZES}, got {ep}"
    if hidden != MC2_HIDDEN:
        return f"MC2 on A3 needs hidden size {MC2_HIDDEN}, got {hidden}"
    if not 1 <= experts <= MC2_MAX_EXPERTS or experts % ep:
        return f"MC2 needs 1..{MC2_MAX_EXPERTS} experts divisible by ep={ep}, got {experts}"
    if not 0 < layer.top_k <= MC2_MAX_TOP_K:
        return f"MC2 on A3 needs 0 < top_k <= {MC2_MAX_TOP_K}, got {layer.top_k}"
    if layer.w13.dtype not in (torch.float16, torch.bfloat16):
        return f"MC2 needs float16/bfloat16 activations, got {layer.w13.dtype}"
    if not 0 < tokens_per_rank <= MC2_MAX_TOKENS:
        return f"MC2 on A3 takes 1..{MC2_MAX_TOKENS} tokens per rank, this batch {tokens_per_rank}"
    return None


class AscendMoERunner(MoERunner):
    name = "ascend"

    def __init__(self) -> None:
        self._generation: str | None = None
        self._logged: set[str] = set()
        self._ep_group: tuple[Any, str] | None = None  # (group, HCCL communicator name)

    def dispatches(self, layer: Any, tokens_per_rank: int) -> bool:
        """The core's optional expert-parallel hook: True where MC2 runs this layer and batch
        (``mc2_refusal``), False for the core's all-gather path; each reason logged once."""
        if self._generation is None:
            from infer_ascend.platform import generation_from_device_name

            self._generation = generation_from_device_name(torch.npu.get_device_name())
        reason = mc2_refusal(self._generation, layer, tokens_per_rank)
        if reason is None:
            self._log_once("expert parallelism through MC2 (npu_moe_distribute_dispatch/_combine)")
            return True
        static = mc2_refusal(self._generation, layer, 1)  # None: only the batch size refused
        self._log_once(f"expert parallelism through the all-gather path: {reason}"
                       if static is not None else
                       f"batches of more than {MC2_MAX_TOKENS} tokens per rank take the "
                       f"all-gather path instead of MC2")
        return False

    def _log_once(self, msg: str) -> None:
        if msg not in self._logged:
            self._logged.add(msg)
            log.info(msg)

    def _group(self, layer: Any, device: torch.device) -> tuple[Any, str]:
        """The HCCL group of the MC2 ops (no other op may use it): made once over the ranks of
        the layer's tensor-parallel group, with its communicator name."""
        if self._ep_group is None:
            ranks = dist.get_process_group_ranks(layer.comm.group or dist.group.WORLD)
            group = dist.new_group(ranks=ranks, backend=dist.get_backend(layer.comm.group))
            name = group._get_backend(device).get_hccl_comm_name(dist.get_rank(group))
            self._ep_group = (group, name)
        return self._ep_group

    def dispatch_combine(self, layer: Any, hidden: torch.Tensor, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor) -> torch.Tensor:
        """MC2: hidden [BS, 7168] this rank's tokens, topk_* [BS, k] (global expert ids) ->
        [BS, 7168], the weighted sum over every rank's experts."""
        group, name = self._group(layer, hidden.device)
        ep, rank, experts = layer.ep_size, dist.get_rank(group), layer.num_experts
        ids = topk_ids.to(torch.int32)
        expand_x, _, expand_idx, counts, recv_counts, tp_recv_counts, _ = \
            torch_npu.npu_moe_distribute_dispatch(
                hidden, ids, name, ep, rank, experts, global_bs=0, expert_token_nums_type=1)
        gate_up = torch_npu.npu_grouped_matmul(
            [expand_x], [kn_layout(layer.w13)], group_list=counts, split_item=2, group_type=0,
            group_list_type=1)[0]  # rows grouped by local expert
        act = torch_npu.npu_swiglu(gate_up, dim=-1)
        down = torch_npu.npu_grouped_matmul(
            [act], [kn_layout(layer.w2)], group_list=counts, split_item=2, group_type=0,
            group_list_type=1)[0]
        return torch_npu.npu_moe_distribute_combine(
            down, ids, expand_idx, recv_counts, topk_weights.float(), name, ep, rank, experts,
            tp_send_counts=tp_recv_counts, global_bs=0)

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
