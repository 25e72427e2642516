"""``triton`` attention backend: our paged Triton kernels (split-KV decode, paged extend).

``plan`` only picks the split count, a function of the batch size alone, so a CUDA graph captured
for a batch size keeps valid launch shapes; the kernels read lengths and page tables from the
metadata tensors, which the graph runner overwrites in place before each replay. The extend
kernel's grid depends only on the host ``max_extend_len`` and the number of sequences, so a whole
extend forward can be captured too (``supports_extend_graph_capture``): the graph runner fixes
``max_extend_len`` to its token bucket and pads the tokens; the kernel zeroes the padding rows.
An fp8 KV cache stores value / scale (per-tensor scales ``k_scale`` / ``v_scale``, 1.0 unless set).
The backend fuses rotary: one kernel rotates q and k and writes k/v into the cache (the rotary
op alone took two launches per layer, plus a copy of q, in the compiled decode step).
"""

from __future__ import annotations

import torch
from infer.core.ops.attention import (
    AttentionBackend,
    AttentionConfig,
    AttentionMetadata,
    RotaryArgs,
)

from infer_cuda.kernels.decode_attention import decode_attention, pick_num_splits
from infer_cuda.kernels.extend_attention import extend_attention
from infer_cuda.kernels.kv_store import write_new_kv


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # interpreter runs: any fixed value works


class TritonAttention(AttentionBackend):
    name = "triton"
    supports_graph_capture = True
    supports_extend_graph_capture = True
    fuses_rotary = True

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.num_splits = 1
        self._num_sms = _num_sms(config.device)

    def plan(self, meta: AttentionMetadata) -> None:
        super().plan(meta)
        if meta.is_decode_only:
            self.num_splits = pick_num_splits(meta.num_seqs, self.config.num_kv_heads,
                                              self.config.max_context_len, self._num_sms)

    @torch.compiler.disable  # launched as is inside a torch.compile'd model (a graph break)
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int,
                rotary: RotaryArgs | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D], caches [P, page, Hkv, D] -> [T, H, D]."""
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        q = write_new_kv(q, k, v, rotary, k_cache, v_cache, meta.slot_mapping, self.k_scale,
                         self.v_scale)
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if meta.is_decode_only:
            decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, out,
                             self.config.scale, self.num_splits, self.k_scale, self.v_scale)
        else:
            extend_attention(q, k_cache, v_cache, meta.query_start_loc, meta.prefix_lens,
                             meta.block_tables, meta.max_extend_len, out, self.config.scale,
                             self.k_scale, self.v_scale)
        return out
