"""SampleSdpaBackend: paged-cache attention with torch.nn.functional.scaled_dot_product_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infer.core.ops.attention import AttentionBackend, write_kv


class SampleSdpaBackend(AttentionBackend):
    name = "sample_sdpa"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        page, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
        k_flat, v_flat = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)  # [slots, Hkv, D]
        group = q.shape[1] // hkv
        out = torch.empty_like(q)  # [T, H, D]
        starts = meta.query_start_loc.tolist()
        for i, kv_len in enumerate(meta.seq_lens_cpu):
            lo, hi = starts[i], starts[i + 1]
            n_new = hi - lo
            pages = meta.block_tables[i, : (kv_len + page - 1) // page].long()
            slots = (pages[:, None] * page + torch.arange(page)).reshape(-1)[:kv_len]
            keys = k_flat[slots].to(q.dtype).repeat_interleave(group, dim=1)  # [L, H, D]
            vals = v_flat[slots].to(q.dtype).repeat_interleave(group, dim=1)
            # new token j sits at position kv_len - n_new + j and sees keys up to it
            pos = torch.arange(kv_len - n_new, kv_len)
            mask = torch.arange(kv_len)[None, :] <= pos[:, None]  # [n_new, L]
            o = F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1), keys.transpose(0, 1),
                                               vals.transpose(0, 1), attn_mask=mask,
                                               scale=self.config.scale)  # [H, n_new, D]
            out[lo:hi] = o.transpose(0, 1)
        return out
