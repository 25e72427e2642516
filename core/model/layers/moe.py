"""Sparse MoE block: a softmax router picks top-k experts per token (routed by the MoE runner's
``select_experts``: the core's ``softmax_topk`` unless the runner overrides it, see
infer.core.ops.moe); the platform's MoE runner computes the experts from stacked weights w13 [E, 2I, D] (gate rows, then up rows) and
w2 [E, D, I]. ``renormalize`` rescales the k chosen probabilities to sum to 1 (Mixtral always,
Qwen3-MoE when ``norm_topk_prob``).

Across ranks (``layers.shard.ExpertShard``): a rank holds E/ep experts, each with I/(tp/ep) of its
intermediate rows, so its w13 is [E/ep, 2I/(tp/ep), D] and w2 [E/ep, D, I/(tp/ep)]. The router
is replicated and every rank routes the same (replicated) tokens. With ep > 1 the (token,
expert) assignments that land on this rank's experts are gathered into rows of one expert each
(k = 1 for the runner) and their outputs scattered back; the partial outputs of all ranks are
summed by one all-reduce through the platform communicator. ``forward_rank_tokens`` is the
variant for ranks holding different tokens: all-gather to dispatch, reduce-scatter to combine.
A runner may take the dispatch and combine over (``MoERunner.dispatches`` /
``dispatch_combine``, infer.core.ops.moe): each rank then routes its own share of the tokens,
the runner returns their full outputs, and the layer neither all-reduces nor reduce-scatters.
"""

from __future__ import annotations

from typing import Any

import torch
from infer.core.model.layers.linear import ReplicatedLinear
from infer.core.model.layers.shard import ExpertShard
from infer.core.model.loader.weights import materialize
from torch import nn


class SparseMoE(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 renormalize: bool, ctx: Any) -> None:
        super().__init__()
        if ctx.quantization == "fp8":
            raise NotImplementedError("--quantization fp8 quantizes dense linear layers only; the MoE "
                                      "runners have no fp8 expert GEMM, so MoE models are refused "
                                      "rather than served with unquantized experts (drop --quantization)")
        self.top_k, self.renormalize = top_k, renormalize
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.tp_size, self.ep_size = ctx.tp_size, getattr(ctx, "ep_size", 1)
        self.tp_rank = ctx.tp_rank
        self.shard = ExpertShard.for_rank(num_experts, intermediate_size, ctx.tp_size,
                                          ctx.tp_rank, self.ep_size)
        self.comm = ctx.comm
        self.runner = ctx.moe_runner
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False,
                                     method=ctx.dense_linear_method)
        kw = {"dtype": ctx.dtype, "device": ctx.device}
        n, i = self.shard.num_experts, self.shard.inter.size
        self.w13 = nn.Parameter(torch.empty(n, 2 * i, hidden_size, **kw), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(n, hidden_size, i, **kw), requires_grad=False)

    def load_expert(self, expert: int, which: str, loaded: Any) -> None:
        """which: "gate" [I, D], "up" [I, D] or "down" [D, I] of one expert; "gate_up" [E, 2I, D]
        or "down_all" [E, D, I] for checkpoints that already stack the experts. Only this rank's
        experts and intermediate slice are read; other experts are skipped."""
        s, full = self.shard, self.intermediate_size
        rows, i = s.inter, s.inter.size
        if which in ("gate_up", "down_all"):
            if loaded.shape[0] != self.num_experts:
                raise ValueError(f"expert weight {which}: checkpoint has {loaded.shape[0]} experts, "
                                 f"model {self.num_experts}")
            loaded = loaded.narrow(0, s.first_expert, s.num_experts)
            if which == "down_all":
                self._copy(self.w2.data, loaded.narrow(2, rows.start, i), which)
                return
            self._copy(self.w13.data[:, :i], loaded.narrow(1, rows.start, i), which)
            self._copy(self.w13.data[:, i:], loaded.narrow(1, full + rows.start, i), which)
            return
        local = s.local(expert)
        if local is None:
            return  # held by another expert-parallel rank
        if which == "down":
            self._copy(self.w2.data[local], loaded.narrow(1, rows.start, i), which)
        else:
            dest = self.w13.data[local, :i] if which == "gate" else self.w13.data[local, i:]
            self._copy(dest, loaded.narrow(0, rows.start, i), which)

    @staticmethod
    def _copy(dest: torch.Tensor, loaded: Any, which: str) -> None:
        if dest.shape != loaded.shape:
            raise ValueError(f"expert weight {which} shape mismatch: checkpoint "
                             f"{tuple(loaded.shape)}, model {tuple(dest.shape)}")
        dest.copy_(materialize(loaded))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] (the same on every rank) -> [T, D]."""
        if self.ep_size > 1 and self.runner.dispatches(self, -(-x.shape[0] // self.tp_size)):
            return self._runner_dispatch(x)
        weights, ids = self.runner.select_experts(self.gate(x), self.top_k,
                                                  self.renormalize)  # [T, k]
        if self.ep_size == 1:
            out = self.runner.apply(x, self.w13, self.w2, weights, ids)
        else:
            out = self._local_experts(x, weights, ids)
        return self.comm.all_reduce(out) if self.tp_size > 1 else out

    def forward_rank_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """For ranks that hold different tokens (data-parallel attention): x [T_r, D], this
        rank's own tokens (T_r may differ per rank) -> [T_r, D]. Dispatch: all-gather every
        rank's tokens (padded to the longest) so each rank sees all of them; each computes its
        experts' partial outputs for all; combine: reduce-scatter hands each rank the sums for
        its own rows. The engine does not run data-parallel attention yet; this is its MoE."""
        if self.tp_size == 1:
            return self.forward(x)
        counts = self.comm.all_gather(torch.tensor([x.shape[0]], device=x.device), dim=0)
        longest = int(counts.max())
        padded = torch.zeros(longest, x.shape[1], dtype=x.dtype, device=x.device)
        padded[:x.shape[0]] = x
        if self.ep_size > 1 and self.runner.dispatches(self, longest):  # the runner's dispatch
            weights, ids = self.runner.select_experts(self.gate(padded), self.top_k,
                                                      self.renormalize)
            return self.runner.dispatch_combine(self, padded, weights, ids)[:x.shape[0]]
        every = self.comm.all_gather(padded, dim=0)  # [W * longest, D]
        weights, ids = self.runner.select_experts(self.gate(every), self.top_k,
                                                  self.renormalize)
        if self.ep_size == 1:
            partial = self.runner.apply(every, self.w13, self.w2, weights, ids)
        else:
            partial = self._local_experts(every, weights, ids)
        return self.comm.reduce_scatter(partial)[:x.shape[0]]  # [T_r, D]

    def _runner_dispatch(self, x: torch.Tensor) -> torch.Tensor:
        """The runner dispatches (MoERunner.dispatches): this rank's equal share of the
        replicated tokens (zero rows pad T to a multiple of the ranks) is routed and handed to
        ``dispatch_combine``; the shares' outputs are all-gathered back into [T, D]."""
        share = -(-x.shape[0] // self.tp_size)
        padded = torch.zeros(share * self.tp_size, x.shape[1], dtype=x.dtype, device=x.device)
        padded[:x.shape[0]] = x
        mine = padded[self.tp_rank * share:(self.tp_rank + 1) * share]
        weights, ids = self.runner.select_experts(self.gate(mine), self.top_k, self.renormalize)
        out = self.runner.dispatch_combine(self, mine, weights, ids)  # [share, D]
        return self.comm.all_gather(out.contiguous(), dim=0)[:x.shape[0]]

    def _local_experts(self, x: torch.Tensor, weights: torch.Tensor,
                       ids: torch.Tensor) -> torch.Tensor:
        """The assignments routed to this rank's experts, one runner row each -> partial [T, D]."""
        local = ids - self.shard.first_expert  # [T, k]
        token, slot = ((local >= 0) & (local < self.shard.num_experts)).nonzero(as_tuple=True)
        out = torch.zeros_like(x)
        if token.numel():
            y = self.runner.apply(x.index_select(0, token), self.w13, self.w2,
                                  weights[token, slot, None], local[token, slot, None])  # [M, D]
            out.index_add_(0, token, y.to(out.dtype))
        return out
