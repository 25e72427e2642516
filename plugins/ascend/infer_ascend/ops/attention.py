"""Attention backend ``ascend``: torch_npu's paged KV write and fused inference attention.

KV cache (the core's layout): k_cache, v_cache [num_pages, page_size, KV_N, D]; the fused
attention reads them as [num_pages, page_size, KV_N*D] (a view) through ``block_table``.

Per layer:
  * ``torch_npu._npu_reshape_and_cache``: new k/v [T, KV_N, D] into the cache at int32 slots.
  * decode-only batches: ``npu_fused_infer_attention_score`` in BSH layout, query [B, 1, N*D],
    host-side ``actual_seq_lengths_kv`` = each sequence's KV length (IncreFlashAttention).
  * any other batch (prefill, extend over a cached prefix, chunked prefill, mixed with decode
    rows): the same op in TND layout, query [T, N, D] packed, ``actual_seq_lengths`` the
    cumulative query lengths, ``actual_seq_lengths_kv`` the KV lengths, and the 2048x2048 causal
    mask with ``sparse_mode=3`` (rightDownCausal: query i of a sequence with q new tokens and L
    keys sees keys j <= L - q + i, i.e. its prefix and the new tokens up to itself).

Graph capture: the host-side lengths are baked into a captured ACL graph; the graph runner
refreshes them before each replay through ``NPUGraph.update`` with ``graph_update_input()``.
The int32 slot indices are converted inside the first layer's forward (a device op, so a
captured graph recomputes them from the static int64 slot buffer on replay).
"""

from __future__ import annotations

import torch
import torch_npu
from infer.core.ops.attention import AttentionBackend, AttentionConfig, AttentionMetadata

HALF = (torch.float16, torch.bfloat16)
MASK_SIZE = 2048  # the "optimised" mask sparse_mode 2/3/4 take


def check_config(config: AttentionConfig) -> None:
    """Refuse settings the torch_npu kernels cannot take, naming the setting to change."""
    if config.dtype not in HALF:
        raise ValueError(f"the ascend attention backend computes in float16 or bfloat16, not "
                         f"{config.dtype}: use --dtype float16 or --dtype bfloat16")
    if config.kv_dtype != config.dtype:
        raise ValueError(f"the ascend attention backend stores the KV cache in the model dtype "
                         f"({config.dtype}); --kv-cache-dtype {config.kv_dtype} is not "
                         f"implemented on Ascend (use --kv-cache-dtype auto)")
    ps = config.page_size
    if ps % 128 or not 128 <= ps <= 512:
        raise ValueError(f"--page-size {ps}: Ascend PageAttention takes blocks of 128, 256, 384 "
                         f"or 512 tokens (default 128)")
    if config.num_heads % config.num_kv_heads or config.num_heads // config.num_kv_heads > 64:
        raise ValueError(f"{config.num_heads} query heads over {config.num_kv_heads} KV heads: "
                         f"the fused attention needs a whole ratio of at most 64")


class AscendAttention(AttentionBackend):
    name = "ascend"
    supports_graph_capture = True

    def __init__(self, config: AttentionConfig) -> None:
        check_config(config)
        super().__init__(config)
        self.mask = torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool,
                                          device=config.device), diagonal=1)
        self._slots: torch.Tensor | None = None  # int32 [T], made by the first layer
        self.kv_lens: list[int] = []
        self.q_cum: list[int] = []

    def plan(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        self._slots = None
        self.kv_lens = list(meta.seq_lens_cpu)
        cum, total = [], 0
        for e in meta.extend_lens_cpu:
            total += e
            cum.append(total)
        self.q_cum = cum

    def graph_update_input(self) -> list[dict[str, list[int]]]:
        """``NPUGraph.update(cpu_update_input=...)`` for a captured decode step: the fused
        attention of every layer gets this batch's KV lengths."""
        return [{"actual_seq_lengths_kv": list(self.kv_lens)}
                for _ in range(self.config.num_layers)]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int,
                rotary: object = None) -> torch.Tensor:
        meta, cfg = self.meta, self.config
        assert meta is not None, "plan() must run before forward()"
        if self._slots is None:
            self._slots = meta.slot_mapping.to(torch.int32)
        torch_npu._npu_reshape_and_cache(k.contiguous(), v.contiguous(), k_cache, v_cache,
                                         self._slots)
        t, h, d = q.shape
        hkv, ps = cfg.num_kv_heads, cfg.page_size
        key = k_cache.view(k_cache.shape[0], ps, hkv * d)  # [pages, page, KV_N*D]
        value = v_cache.view(v_cache.shape[0], ps, hkv * d)
        common = dict(block_table=meta.block_tables, block_size=ps, num_heads=h,
                      num_key_value_heads=hkv, scale=cfg.scale,
                      actual_seq_lengths_kv=self.kv_lens)
        if meta.is_decode_only:
            out, _ = torch_npu.npu_fused_infer_attention_score(
                q.contiguous().view(t, 1, h * d), key, value, input_layout="BSH", **common)
        else:
            out, _ = torch_npu.npu_fused_infer_attention_score(
                q.contiguous(), key, value, input_layout="TND", actual_seq_lengths=self.q_cum,
                atten_mask=self.mask, sparse_mode=3, **common)
        return out.view(t, h, d)
