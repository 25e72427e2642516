"""Emulated MC2 expert-parallel dispatch and combine of torch_npu, over the torch.distributed
group that carries "hccl" here (gloo).

Documents: op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch.md and
torch_npu-npu_moe_distribute_combine.md (hiascend.com "torch_npu.npu_moe_distribute_dispatch" /
"torch_npu.npu_moe_distribute_combine", Ascend Extension for PyTorch 7.0 reference ptaoplist_002364
/ ptaoplist_002363). Only the A3 form without a TP domain, shared experts or quantization is
emulated (the form infer's plugin calls); other forms raise NotImplementedError and A2 (whose
ep_recv_counts carries extra communication offsets) is refused.

Facts taken from the documents and checked on every call:
  * x [BS, H] float16/bfloat16; expert_ids int32 [BS, K], values in [0, moe_expert_num), the K of
    a row distinct; A3: H == 7168, 0 < BS <= 512, 0 < K <= 8, ep_world_size in
    {8, 16, 32, 64, 128, 144, 256, 288}; moe_expert_num in [1, 512], divisible by ep_world_size;
    expert_scales is not supported on A3 (None).
  * group_ep is the HCCL communicator name of the EP group (``get_hccl_comm_name``), length in
    [1, 128); the parameters must agree on all ranks.
  * global_bs: 0 only when every rank's BS is equal; otherwise max_bs * ep_world_size.
  * Outputs of dispatch: expand_x [A, H] with A = (global_bs or BS * ep_world_size) *
    min(local_expert_num, K); dynamic_scales None (quant_mode 0); expand_idx int32 [BS * K];
    expert_token_nums int64 [local_expert_num] (expert_token_nums_type 1: counts, 0: prefix sums);
    ep_recv_counts int32 [ep_world_size * local_expert_num], prefix sums; tp_recv_counts int32
    [tp_world_size] (empty without a TP domain); expand_scales None on A3.
  * combine returns x [BS, H] in expand_x's dtype: every (token, k) row sent by dispatch comes
    back from the expert that computed it, multiplied by expert_scales[token, k] (float32) and
    summed over k.

The documents say that the values of expand_idx and ep_recv_counts are the op's business ("pass
them to combine"); the layout emulated, which no caller may depend on: the rows a rank receives
are ordered by local expert, then by source rank, then by the source's token order;
ep_recv_counts[e * W + r] is the prefix sum up to (local expert e, source rank r) inclusive;
expand_idx[t * K + k] is the number of earlier tokens of this rank sent to expert_ids[t, k].
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._check import dtype_in, need
from ._graph import recorded

A3_EP_SIZES = (8, 16, 32, 64, 128, 144, 256, 288)
_GROUPS: dict[str, object] = {}  # communicator name -> the gloo backend carrying "hccl"


def _comm_name(backend: object, rank: int) -> str:
    """``ProcessGroupHCCL.get_hccl_comm_name(rank)``: a name that identifies the group's
    communicator (here: registered so that the emulated MC2 ops find the group again)."""
    name = f"emulated_hccl_{id(backend):x}"
    _GROUPS[name] = backend
    return name


def install_comm_names() -> None:
    """Give the backend that carries "hccl" the communicator-name query torch_npu's HCCL backend
    has (``group._get_backend(device).get_hccl_comm_name(rank)``)."""
    dist.ProcessGroupGloo.get_hccl_comm_name = _comm_name


def _generation() -> str:
    from . import npu

    return "A3" if "910_93" in npu.DEVICE["name"] else "A2"


def _group(name: str, ep_world_size: int, ep_rank_id: int) -> object:
    need(isinstance(name, str) and 1 <= len(name) < 128, "group_ep: a name of length [1, 128)")
    backend = _GROUPS.get(name)
    need(backend is not None, f"group_ep {name!r} is not an HCCL communicator name")
    need(backend.size() == ep_world_size, "ep_world_size must be the size of group_ep")
    need(backend.rank() == ep_rank_id, "ep_rank_id must be this rank's rank in group_ep")
    return backend


def _gather(backend: object, t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(backend.size())]
    backend.allgather([out], [t.contiguous()]).wait()
    return out


def _common(h: int, bs: int, k: int, ep_world_size: int, moe_expert_num: int, tp_world_size: int,
            shared_expert_rank_num: int, expert_shard_type: int, shared_expert_num: int) -> int:
    need(_generation() == "A3", "only the A3 form of MC2 dispatch/combine is emulated")
    need(h == 7168, f"A3: H must be 7168, got {h}")
    need(0 < bs <= 512, f"A3: BS must be in (0, 512], got {bs}")
    need(0 < k <= 8 and k <= moe_expert_num, f"A3: K must be in (0, 8] and <= experts, got {k}")
    need(ep_world_size in A3_EP_SIZES, f"A3: ep_world_size must be one of {A3_EP_SIZES}")
    need(1 <= moe_expert_num <= 512 and moe_expert_num % ep_world_size == 0,
         "moe_expert_num must be in [1, 512] and divisible by ep_world_size")
    if tp_world_size not in (0, 1) or shared_expert_rank_num or expert_shard_type \
            or shared_expert_num != 1:
        raise NotImplementedError("emulation covers no TP domain and no shared experts")
    return moe_expert_num // ep_world_size


def _bs_check(backend: object, bs: int, ep_world_size: int, global_bs: int) -> int:
    """Every rank's BS; returns the max. global_bs 0 needs equal BS everywhere."""
    sizes = [int(s) for s in _gather(backend, torch.tensor([bs]))]
    if global_bs == 0:
        need(len(set(sizes)) == 1, "global_bs 0 needs the same BS on every rank")
    else:
        need(global_bs == max(sizes) * ep_world_size,
             f"global_bs must be max_bs * ep_world_size = {max(sizes) * ep_world_size}")
    return max(sizes)


def _pairs(expert_ids: torch.Tensor, moe_expert_num: int) -> None:
    dtype_in("expert_ids", expert_ids, (torch.int32,))
    need(expert_ids.dim() == 2, "expert_ids [BS, K] expected")
    need(bool(((expert_ids >= 0) & (expert_ids < moe_expert_num)).all()),
         "expert_ids values must be in [0, moe_expert_num)")
    srt = expert_ids.sort(dim=1).values
    need(bool((srt[:, 1:] != srt[:, :-1]).all()), "the K expert ids of a row must be distinct")


@recorded()
def npu_moe_distribute_dispatch(x: torch.Tensor, expert_ids: torch.Tensor, group_ep: str,
                                ep_world_size: int, ep_rank_id: int, moe_expert_num: int, *,
                                scales=None, x_active_mask=None, expert_scales=None,
                                group_tp: str = "", tp_world_size: int = 0, tp_rank_id: int = 0,
                                expert_shard_type: int = 0, shared_expert_num: int = 1,
                                shared_expert_rank_num: int = 0, quant_mode: int = 0,
                                global_bs: int = 0, expert_token_nums_type: int = 1) -> tuple:
    """Send each (token, k) row to the rank holding expert_ids[token, k] (experts numbered
    rank-major: rank r holds [r * L, (r + 1) * L), L = local_expert_num). See the module doc."""
    dtype_in("x", x, (torch.float16, torch.bfloat16))
    need(x.dim() == 2, "x [BS, H] expected")
    _pairs(expert_ids, moe_expert_num)
    need(expert_ids.shape[0] == x.shape[0], "x and expert_ids must have the same BS")
    bs, k = expert_ids.shape
    local = _common(x.shape[1], bs, k, ep_world_size, moe_expert_num, tp_world_size,
                    shared_expert_rank_num, expert_shard_type, shared_expert_num)
    need(expert_scales is None, "A3: expert_scales is not supported (leave it None)")
    if quant_mode != 0 or scales is not None:
        raise NotImplementedError("emulation covers quant_mode 0 (no scales)")
    need(expert_token_nums_type in (0, 1), "expert_token_nums_type must be 0 or 1")
    backend = _group(group_ep, ep_world_size, ep_rank_id)
    max_bs = _bs_check(backend, bs, ep_world_size, global_bs)
    rows = (global_bs or bs * ep_world_size) * min(local, k)
    pad_x = torch.zeros(max_bs, x.shape[1], dtype=x.dtype)
    pad_x[:bs] = x
    pad_ids = torch.full((max_bs, k), -1, dtype=torch.int32)
    pad_ids[:bs] = expert_ids
    xs, ids = _gather(backend, pad_x), _gather(backend, pad_ids)
    expand_x = torch.zeros(rows, x.shape[1], dtype=x.dtype)
    recv = torch.zeros(ep_world_size * local, dtype=torch.int32)
    counts = torch.zeros(local, dtype=torch.int64)
    n = 0
    for e in range(local):
        expert = ep_rank_id * local + e
        for src in range(ep_world_size):
            tokens = (ids[src] == expert).any(dim=1).nonzero().flatten()  # source token order
            expand_x[n:n + tokens.numel()] = xs[src][tokens]
            n += tokens.numel()
            counts[e] += tokens.numel()
            recv[e * ep_world_size + src] = n
    # expand_idx[t * K + k]: earlier tokens of this rank sent to the same expert
    flat = expert_ids.reshape(-1).long()
    same = (flat[:, None] == flat[None, :]) & (torch.arange(flat.numel())[None, :] // k
                                                < torch.arange(flat.numel())[:, None] // k)
    expand_idx = same.sum(dim=1).to(torch.int32)
    tokens_num = counts if expert_token_nums_type == 1 else counts.cumsum(0)
    return (expand_x, None, expand_idx, tokens_num, recv,
            torch.zeros(0, dtype=torch.int32), None)


@recorded()
def npu_moe_distribute_combine(expand_x: torch.Tensor, expert_ids: torch.Tensor,
                               expand_idx: torch.Tensor, ep_send_counts: torch.Tensor,
                               expert_scales: torch.Tensor, group_ep: str, ep_world_size: int,
                               ep_rank_id: int, moe_expert_num: int, *, tp_send_counts=None,
                               x_active_mask=None, activation_scale=None, weight_scale=None,
                               group_list=None, expand_scales=None, shared_expert_x=None,
                               group_tp: str = "", tp_world_size: int = 0, tp_rank_id: int = 0,
                               expert_shard_type: int = 0, shared_expert_num: int = 1,
                               shared_expert_rank_num: int = 0, global_bs: int = 0,
                               out_dtype: int = 0, comm_quant_mode: int = 0,
                               group_list_type: int = 0) -> torch.Tensor:
    """Return each rank's rows from the experts that computed them, weighted by expert_scales
    and summed over K: out[t] = sum_k expert_scales[t, k] * expand_x_owner[row(t, k)], where
    the owner of expert e is rank e // L and row(t, k) = (owner's ep_send_counts before block
    (e % L, this rank)) + expand_idx[t * K + k]. See the module doc."""
    dtype_in("expand_x", expand_x, (torch.float16, torch.bfloat16))
    _pairs(expert_ids, moe_expert_num)
    bs, k = expert_ids.shape
    local = _common(expand_x.shape[1], bs, k, ep_world_size, moe_expert_num, tp_world_size,
                    shared_expert_rank_num, expert_shard_type, shared_expert_num)
    dtype_in("expand_idx", expand_idx, (torch.int32,))
    dtype_in("ep_send_counts", ep_send_counts, (torch.int32,))
    dtype_in("expert_scales", expert_scales, (torch.float32,))
    need(expand_idx.shape == (bs * k,), "expand_idx must be [BS * K]")
    need(ep_send_counts.shape == (ep_world_size * local,),
         "A3: ep_send_counts must be [ep_world_size * local_expert_num]")
    need(expert_scales.shape == (bs, k), "expert_scales must be [BS, K]")
    need(expand_scales is None, "A3: expand_scales is not supported (leave it None)")
    if comm_quant_mode != 0:
        raise NotImplementedError("emulation covers comm_quant_mode 0")
    backend = _group(group_ep, ep_world_size, ep_rank_id)
    _bs_check(backend, bs, ep_world_size, global_bs)
    need(expand_x.shape[0] >= (global_bs or bs * ep_world_size) * min(local, k),
         "expand_x must have A rows")
    rows_of = _gather(backend, expand_x)
    sends_of = _gather(backend, ep_send_counts)
    out = torch.zeros(bs, expand_x.shape[1], dtype=torch.float32)
    for t in range(bs):
        for j in range(k):
            e = int(expert_ids[t, j])
            owner, block = divmod(e, local)
            at = block * ep_world_size + ep_rank_id
            start = int(sends_of[owner][at - 1]) if at else 0
            end = int(sends_of[owner][at])
            row = start + int(expand_idx[t * k + j])
            need(row < end, "expand_idx points past the rows the expert received from this rank")
            out[t] += expert_scales[t, j] * rows_of[owner][row].float()
    return out.to(expand_x.dtype)
