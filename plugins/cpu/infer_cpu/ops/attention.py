"""``torch_native`` on the CPU: the core's reference backend plus the native paged-decode kernel.

Decode-only batches over a float32 cache on the CPU run ``infer_cpu.kernels.paged_decode`` (one
call writes the new k/v and attends every sequence over its own pages, no gather); everything
else, and any input the kernel declines, runs the reference
(``infer.core.ops.reference.attention``), which the kernel is tested against.
"""

from __future__ import annotations

import torch
from infer.core.ops.attention import AttentionMetadata
from infer.core.ops.reference.attention import TorchNativeAttention as ReferenceAttention

from infer_cpu import kernels


class TorchNativeAttention(ReferenceAttention):
    def plan(self, meta: AttentionMetadata) -> None:
        self._native_decode = (meta.is_decode_only and self.config.kv_dtype == torch.float32
                               and self.config.device.type == "cpu" and kernels.load() is not None)
        if self._native_decode:
            self.meta = meta  # the reference's plans are made only if the kernel declines
        else:
            super().plan(meta)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D], caches [P, page, Hkv, D] -> [T, H, D]."""
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        if self._native_decode:
            out = kernels.paged_decode(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                       meta.block_tables, meta.seq_lens, meta.page_size,
                                       self.config.scale)
            if out is not None:
                return out
            self._native_decode = False  # inputs the kernel does not take: the reference, this step
            super().plan(meta)
        return super().forward(q, k, v, k_cache, v_cache, layer_id)
