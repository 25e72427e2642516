"""Emulated attention ops of torch_npu: the paged KV write and the fused inference attention.

Only the forms infer's ascend backend calls are emulated; any other form raises
NotImplementedError rather than guessing.
"""

from __future__ import annotations

import torch

from ._check import dtype_in, host_ints, need
from ._graph import recorded

HALF = (torch.float16, torch.bfloat16)
MASK_SIZE = 2048


@recorded()
def _npu_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, slot_indices: torch.Tensor) -> None:
    """Write each token's key/value into the paged cache, in place.

    Semantics as vllm-ascend calls it (vllm_ascend/attention/attention_v1.py,
    ``torch_npu._npu_reshape_and_cache(key=, value=, key_cache=, value_cache=, slot_indices=)``;
    the ATB ReshapeAndCache operator, https://www.hiascend.com/document -> CANN ATB
    "ReshapeAndCacheOperation"): key/value [T, KV_N, D]; caches [num_blocks, block_size, KV_N, D];
    slot_indices int32 [T], slot s = block * block_size + offset. Nothing is returned.
    """
    need(key.dim() == 3 and value.dim() == 3, "key/value must be [T, KV_N, D]")
    need(key_cache.dim() == 4 and value_cache.dim() == 4,
         "key_cache/value_cache must be [num_blocks, block_size, KV_N, D]")
    need(key_cache.shape[2:] == key.shape[1:], f"cache heads/dim {tuple(key_cache.shape[2:])} "
         f"!= key {tuple(key.shape[1:])}")
    dtype_in("slot_indices", slot_indices, (torch.int32,))
    need(slot_indices.shape == (key.shape[0],), "slot_indices must be [T]")
    need(key_cache.dtype == key.dtype, "key and key_cache dtypes differ")
    hkv, d = key.shape[1:]
    idx = slot_indices.long()
    key_cache.view(-1, hkv, d).index_copy_(0, idx, key)
    value_cache.view(-1, hkv, d).index_copy_(0, idx, value)


def _causal_mask_ok(mask: torch.Tensor) -> bool:
    """sparse_mode 2/3/4 take the 'optimised' 2048x2048 mask: 1 (True) above the diagonal."""
    if mask.shape[-2:] != (MASK_SIZE, MASK_SIZE) or mask.dtype not in (torch.bool, torch.int8,
                                                                      torch.uint8):
        return False
    ref = torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool), diagonal=1)
    return bool(torch.equal(mask.reshape(MASK_SIZE, MASK_SIZE).bool().cpu(), ref))


def _gather_kv(cache: torch.Tensor, table_row: torch.Tensor, n: int, block_size: int,
               hkv: int, d: int) -> torch.Tensor:
    """First n tokens of one sequence from a paged cache [blocks, block_size, KV_N*D]."""
    blocks = -(-n // block_size)
    pages = cache.index_select(0, table_row[:blocks].long())  # [blocks, block_size, H]
    return pages.reshape(-1, hkv, d)[:n]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            causal_offset: int | None) -> torch.Tensor:
    """q [S, N, D], k/v [L, KV_N, D] -> [S, N, D] in float32. causal_offset: query i sees keys
    j <= causal_offset + i (rightDownCausal: offset = L - S); None: no mask."""
    n, hkv = q.shape[1], k.shape[1]
    rep = n // hkv
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    scores = torch.einsum("snd,lnd->nsl", q.float(), kf) * scale
    if causal_offset is not None:
        s, length = q.shape[0], k.shape[0]
        allowed = (torch.arange(length)[None, :] <= torch.arange(s)[:, None] + causal_offset)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("nsl,lnd->snd", torch.softmax(scores, dim=-1), vf)


@recorded(updatable=("actual_seq_lengths", "actual_seq_lengths_kv"))
def npu_fused_infer_attention_score(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, atten_mask=None,
        actual_seq_lengths=None, actual_seq_lengths_kv=None, block_table=None, num_heads: int = 1,
        scale: float = 1.0, pre_tokens: int = 2147483647, next_tokens: int = 2147483647,
        input_layout: str = "BSH", num_key_value_heads: int = 0, sparse_mode: int = 0,
        inner_precise: int = 0, block_size: int = 0, softmax_lse_flag: bool = False,
        **unsupported) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention for inference (PromptFlashAttention when Q_S > 1, IncreFlashAttention when
    Q_S == 1), emulated for the PageAttention forms.

    Document: Ascend op-plugin docs/context/torch_npu-npu_fused_infer_attention_score.md
    (https://gitee.com/ascend/op-plugin, also hiascend.com "torch_npu.npu_fused_infer_attention_score",
    Ascend Extension for PyTorch 7.0 API reference ptaoplist_001232). Facts used:
      * query fp16/bf16, contiguous. ``input_layout`` "BSH": query [B, S, N*D], output likewise;
        "TND": query [T, N, D] packed, output [T, N, D].
      * PageAttention is on when ``block_table`` (int32 [B, max_blocks]) is given; key/value are
        then the caches laid out [num_blocks, block_size, KV_N*D]; ``block_size`` must be a
        multiple of 128 in [128, 512]; ``actual_seq_lengths_kv`` is required and holds each
        batch's KV length (not cumulative), host-side ints.
      * TND: ``actual_seq_lengths`` is required, its length is the batch, each element the
        cumulative query length up to and including that batch (non-decreasing).
      * ``num_key_value_heads`` 0 means equal to ``num_heads``; num_heads % KV_N == 0.
      * sparse_mode 0 without a mask: no masking. sparse_mode 3 (rightDownCausal) needs the
        optimised 2048x2048 mask (1 above the diagonal); query i of a batch with Q_S queries and
        KV_S keys sees keys j <= KV_S - Q_S + i. When Q_S == 1 the mask is not applied.
      * returns (attention_out, softmax_lse); softmax_lse is a [1] zero tensor unless
        softmax_lse_flag.
    """
    if unsupported:
        raise NotImplementedError(f"emulation does not cover arguments {sorted(unsupported)}")
    dtype_in("query", query, HALF)
    need(query.is_contiguous(), "query must be contiguous")
    if block_table is None:
        raise NotImplementedError("emulation covers the PageAttention forms only (block_table)")
    dtype_in("block_table", block_table, (torch.int32,))
    need(block_table.dim() == 2, "block_table must be [B, max_blocks]")
    need(block_size % 128 == 0 and 128 <= block_size <= 512,
         f"block_size {block_size}: PageAttention needs a multiple of 128 in [128, 512]")
    need(key.dim() == 3 and key.shape[1] == block_size and key.shape == value.shape,
         "paged key/value must be [num_blocks, block_size, KV_N*D] and equal in shape")
    need(key.dtype == query.dtype, "key dtype must equal query dtype")
    kv_heads = num_key_value_heads or num_heads
    need(num_heads % kv_heads == 0, "num_heads must be a multiple of num_key_value_heads")
    kv_lens = host_ints("actual_seq_lengths_kv", actual_seq_lengths_kv)
    if input_layout == "BSH":
        b, s, h = query.shape
        d = h // num_heads
        need(d * num_heads == h, "BSH query hidden size must be num_heads * D")
        q_lens = [s] * b
        q_rows = query.view(b * s, num_heads, d)
        starts = [i * s for i in range(b)]
    elif input_layout == "TND":
        t, n, d = query.shape
        need(n == num_heads, "TND query N must equal num_heads")
        cum = host_ints("actual_seq_lengths", actual_seq_lengths)
        b = len(cum)
        need(all(x <= y for x, y in zip([0] + cum, cum, strict=False)),
             "actual_seq_lengths must be cumulative (non-decreasing)")
        need(cum[-1] <= t, "actual_seq_lengths exceeds the query's T")
        q_lens = [y - x for x, y in zip([0] + cum, cum, strict=False)]
        starts = [0] + cum[:-1]
        q_rows = query
    else:
        raise NotImplementedError(f"input_layout {input_layout!r} is not emulated")
    need(len(kv_lens) >= b, "actual_seq_lengths_kv needs one length per batch")
    need(block_table.shape[0] == b, f"block_table rows {block_table.shape[0]} != batch {b}")
    need(key.shape[2] == kv_heads * d, f"paged key H {key.shape[2]} != KV_N*D {kv_heads * d}")
    if sparse_mode == 3:
        need(atten_mask is not None and _causal_mask_ok(atten_mask),
             "sparse_mode 3 needs the optimised 2048x2048 mask (True above the diagonal)")
    elif sparse_mode != 0 or atten_mask is not None:
        raise NotImplementedError("emulation covers sparse_mode 0 without a mask and 3")
    out = torch.zeros(q_rows.shape, dtype=torch.float32)
    for i in range(b):
        qn, kvn = q_lens[i], kv_lens[i]
        if qn == 0:
            continue
        need(kvn <= block_table.shape[1] * block_size, "a KV length exceeds its block table row")
        k = _gather_kv(key, block_table[i], kvn, block_size, kv_heads, d)
        v = _gather_kv(value, block_table[i], kvn, block_size, kv_heads, d)
        causal = kvn - qn if (sparse_mode == 3 and qn > 1) else None
        out[starts[i]:starts[i] + qn] = _attend(q_rows[starts[i]:starts[i] + qn], k, v, scale,
                                                causal)
    lse = torch.zeros(1, dtype=torch.float32)
    return out.to(query.dtype).view(query.shape), lse
