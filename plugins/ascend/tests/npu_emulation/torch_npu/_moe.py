"""Emulated MoE routing ops and the grouped matmul of torch_npu."""

from __future__ import annotations

import torch

from ._check import dtype_in, need
from ._graph import recorded

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@recorded()
def npu_moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, *, scale=None, offset=None,
                            active_num: int = -1, expert_capacity: int = -1, expert_num: int = -1,
                            drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range=(), row_idx_type: int = 0
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, k) pairs by expert and gather the token rows in that order.

    Document: op-plugin docs/context/torch_npu-npu_moe_init_routing_v2.md (hiascend.com
    "torch_npu.npu_moe_init_routing_v2"). expert_idx int32 [NUM_ROWS, K]; pairs are numbered
    flat p = row * K + k and sorted stably by expert id (sortedRowIdx). expanded_x[i] =
    x[sortedRowIdx[i] // K]. row_idx_type 0 returns the gather index expanded_row_idx[p] = i
    (where pair p landed), 1 the scatter index expanded_row_idx[i] = sortedRowIdx[i].
    active_expert_range [start, end): only pairs whose expert is in range are kept (the first
    rows of expanded_x; other rows are zero, their expanded_row_idx entries -1).
    expert_tokens_num_type 0: cumulative counts, 1: counts per expert of the range (int64).
    quant_mode -1: no quantization (expanded_scale is then an empty tensor). Only the dropless
    mode (drop_pad_mode 0) is emulated.
    """
    dtype_in("x", x, FLOATS)
    dtype_in("expert_idx", expert_idx, (torch.int32,))
    need(x.dim() == 2 and expert_idx.dim() == 2 and expert_idx.shape[0] == x.shape[0],
         "x [NUM_ROWS, H] and expert_idx [NUM_ROWS, K] expected")
    if drop_pad_mode != 0 or quant_mode != -1 or scale is not None or offset is not None:
        raise NotImplementedError("emulation covers dropless, unquantized routing")
    rows, k = expert_idx.shape
    start, end = (list(active_expert_range) or [0, expert_num])
    need(0 <= start < end, "active_expert_range must be [start, end) with start < end")
    flat = expert_idx.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices  # sortedRowIdx
    sorted_e = flat[order]
    keep = (sorted_e >= start) & (sorted_e < end)
    n_keep = int(keep.sum())
    kept = order[keep]
    expanded_x = torch.zeros(rows * k, x.shape[1], dtype=x.dtype)
    expanded_x[:n_keep] = x.index_select(0, kept // k)
    if row_idx_type == 0:
        row_idx = torch.full((rows * k,), -1, dtype=torch.int32)
        row_idx[kept] = torch.arange(n_keep, dtype=torch.int32)
    elif row_idx_type == 1:
        row_idx = torch.full((rows * k,), -1, dtype=torch.int32)
        row_idx[:n_keep] = kept.to(torch.int32)
    else:
        raise ValueError("row_idx_type must be 0 or 1")
    counts = torch.bincount(sorted_e[keep] - start, minlength=end - start).to(torch.int64)
    if expert_tokens_num_type == 0:
        tokens = counts.cumsum(0)
    elif expert_tokens_num_type == 1:
        tokens = counts
    else:
        raise NotImplementedError("expert_tokens_num_type 2 (key-value) is not emulated")
    if not expert_tokens_num_flag:
        tokens = torch.empty(0, dtype=torch.int64)
    return expanded_x, row_idx, tokens, torch.empty(0, dtype=torch.float32)


@recorded()
def npu_grouped_matmul(x: list[torch.Tensor], weight: list[torch.Tensor], *, bias=None,
                       group_list: torch.Tensor | None = None, split_item: int = 0,
                       group_type: int | None = None, group_list_type: int = 0,
                       output_dtype: torch.dtype | None = None, **unsupported
                       ) -> list[torch.Tensor]:
    """Grouped GEMM. Document: op-plugin docs/context/torch_npu-npu_grouped_matmul.md (hiascend.com
    "torch_npu.npu_grouped_matmul"). The form emulated is the MoE one: x = [X [M, K]] (one tensor,
    rows grouped by expert), weight = [W [E, K, N]], group_type 0 (split along M), split_item 2 or
    3 (one output tensor), group_list int64 [E]: group_list_type 0 cumulative row ends, 1 row
    counts. Rows past the last group are not computed (zeros). Returns [Y [M, N]].
    """
    if unsupported or bias is not None:
        raise NotImplementedError(f"emulation does not cover {sorted(unsupported) or ['bias']}")
    need(isinstance(x, (list, tuple)) and isinstance(weight, (list, tuple)),
         "x and weight are lists of tensors")
    need(len(x) == 1 and len(weight) == 1, "emulation covers one x and one stacked weight")
    need(group_type == 0 and split_item in (2, 3), "emulation covers group_type 0, split_item 2/3")
    xm, w = x[0], weight[0]
    need(w.dim() == 3 and xm.dim() == 2 and xm.shape[1] == w.shape[1],
         f"x [M, K] and weight [E, K, N] expected, got {tuple(xm.shape)}, {tuple(w.shape)}")
    need(xm.dtype == w.dtype, "x and weight dtypes differ")
    dtype_in("group_list", group_list, (torch.int64,))
    need(group_list.shape == (w.shape[0],), "group_list must have one entry per expert")
    if group_list_type == 0:
        ends = group_list.tolist()
        need(all(a <= b for a, b in zip([0] + ends, ends, strict=False)),
             "a cumulative group_list must be non-decreasing")
    elif group_list_type == 1:
        ends = group_list.cumsum(0).tolist()
    else:
        raise ValueError("group_list_type must be 0 or 1")
    need(ends[-1] <= xm.shape[0], "group_list covers more rows than x has")
    out = torch.zeros(xm.shape[0], w.shape[2], dtype=output_dtype or xm.dtype)
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            out[start:end] = (xm[start:end].float() @ w[e].float()).to(out.dtype)
        start = end
    return [out]


@recorded()
def npu_moe_finalize_routing(expanded_permuted_rows: torch.Tensor, skip1, skip2, bias,
                             scales: torch.Tensor, expanded_src_to_dst_row: torch.Tensor,
                             export_for_source_row, drop_pad_mode: int = 0) -> torch.Tensor:
    """out[i] = skip1[i] + skip2[i] + sum_k scales[i, k] * (rows[src_to_dst[idx(i, k)]] +
    bias[expert(i, k)]). drop_pad_mode 0: idx = i + k * NUM_ROWS (column order), 2: idx =
    i * K + k (row order). Document: op-plugin docs/context/torch_npu-npu_moe_finalize_routing.md
    (hiascend.com "torch_npu.npu_moe_finalize_routing"); scales share the rows' dtype,
    expanded_src_to_dst_row is int32 [NUM_ROWS * K]."""
    dtype_in("expanded_permuted_rows", expanded_permuted_rows, FLOATS)
    dtype_in("expanded_src_to_dst_row", expanded_src_to_dst_row, (torch.int32,))
    need(scales.dtype == expanded_permuted_rows.dtype, "scales must have the rows' dtype")
    rows, k = scales.shape
    need(expanded_src_to_dst_row.shape == (rows * k,), "expanded_src_to_dst_row must be [NUM_ROWS*K]")
    if drop_pad_mode == 0:
        idx = expanded_src_to_dst_row.view(k, rows).t()
    elif drop_pad_mode == 2:
        idx = expanded_src_to_dst_row.view(rows, k)
    else:
        raise NotImplementedError("emulation covers the dropless modes 0 and 2")
    need(bool((idx >= 0).all()), "every (row, k) pair needs a destination row")
    picked = expanded_permuted_rows.float()[idx.long()]  # [rows, k, H]
    if bias is not None:
        picked = picked + bias.float()[export_for_source_row.long()]
    out = (picked * scales.float()[..., None]).sum(1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.float()
    return out.to(expanded_permuted_rows.dtype)


@recorded()
def npu_moe_gating_top_k_softmax(x: torch.Tensor, finished: torch.Tensor | None = None,
                                 k: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax over the last axis, then its top k: y (x's dtype) [.., k], expert_idx int32
    [.., k] (a row whose ``finished`` is True gets the expert number E, x's last-axis size), and
    row_idx int32 with row_idx[i, j] = j * N + i (arange(N * k) laid out [k, N], transposed: the
    column-major numbering npu_moe_init_routing v1 takes). No renormalisation of the k values.
    Document: hiascend.com "torch_npu.npu_moe_gating_top_k_softmax" and CANN
    "aclnnMoeGatingTopKSoftmax" (its formula). Emulated for 2-D x; ties go to the lower expert
    index (torch.topk's order), which only the device can confirm."""
    dtype_in("x", x, FLOATS)
    need(x.dim() == 2, "emulation covers 2-D x [N, E]")
    need(isinstance(k, int) and 0 < k <= min(x.shape[-1], 1024), "k must be in (0, E], <= 1024")
    probs = torch.softmax(x.float(), dim=-1)
    y, idx = torch.topk(probs, k, dim=-1)
    idx = idx.to(torch.int32)
    if finished is not None:
        dtype_in("finished", finished, (torch.bool,))
        need(finished.shape == x.shape[:-1], "finished must have x's shape without its last axis")
        idx[finished] = x.shape[-1]
    n = x.shape[0]
    row_idx = torch.arange(n * k, dtype=torch.int32).view(k, n).t().contiguous()
    return y.to(x.dtype), idx, row_idx
