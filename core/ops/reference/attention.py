"""``torch_native`` attention: torch SDPA over the paged KV cache, plain torch on any device.

Mixed batches run one sequence at a time; decode-only batches run as one padded SDPA call over
``[B, max_pages * page_size]`` keys with a length mask. Each sequence gathers only its own pages
(``block_tables[i, :ceil(seq_len / page_size)]``), so a step costs O(sum of sequence lengths),
never a copy of the whole cache. Any mix of prefill, chunked-extend and decode rows is handled:
the queries of sequence i sit at absolute positions ``prefix_len .. seq_len - 1`` and see every
key at a position not after their own. An fp8 cache (``--kv-cache-dtype fp8_*``) stores
value / scale and is read back upcast times the scale (per-tensor ``k_scale`` / ``v_scale``, 1.0
unless set). Every other attention backend is tested against this one (``infer.core.testing``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from infer.core.ops.attention import (
    AttentionBackend,
    AttentionConfig,
    AttentionMetadata,
    read_pages,
    write_kv,
)


@dataclass
class _SeqPlan:
    start: int  # first packed query row
    end: int  # one past the last packed query row
    seq_len: int  # kv length after this step
    pages: torch.Tensor  # [n_pages] page ids holding this sequence's kv
    mask: torch.Tensor | None  # [ext, seq_len] bool (True = attend), None when not needed
    causal: bool  # plain top-left causal mask (prefix 0, ext > 1)


class TorchNativeAttention(AttentionBackend):
    name = "torch_native"
    supports_graph_capture = False

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        self.k_scale = 1.0  # per-tensor scales of an fp8 cache (stored value = k / k_scale)
        self.v_scale = 1.0

    def plan(self, meta: AttentionMetadata) -> None:
        """Per-sequence row ranges, page lists and masks, shared by every layer of the step."""
        super().plan(meta)
        self._make_plans(meta)

    def _make_plans(self, meta: AttentionMetadata) -> None:
        page = meta.page_size
        plans: list[_SeqPlan] = []
        start = 0
        for i, (seq_len, ext) in enumerate(zip(meta.seq_lens_cpu, meta.extend_lens_cpu, strict=False)):
            prefix = seq_len - ext
            n_pages = -(-seq_len // page)
            mask = None
            if ext > 1 and prefix > 0:
                q_pos = torch.arange(prefix, seq_len, device=meta.block_tables.device)[:, None]
                k_pos = torch.arange(seq_len, device=meta.block_tables.device)[None, :]
                mask = k_pos <= q_pos  # [ext, seq_len]
            plans.append(_SeqPlan(start, start + ext, seq_len,
                                  meta.block_tables[i, :n_pages].long(), mask,
                                  causal=ext > 1 and prefix == 0))
            start += ext
        self._plans = plans
        self._decode_mask = None
        if meta.is_decode_only and meta.num_seqs > 1:
            n_pages = -(-meta.max_seq_len // page)
            self._decode_pages = meta.block_tables[:, :n_pages].long().reshape(-1)  # [B*n_pages]
            k_pos = torch.arange(n_pages * page, device=meta.block_tables.device)
            self._decode_mask = (k_pos[None, :] < meta.seq_lens[:, None].long())[:, None, None, :]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D], caches [P, page, Hkv, D] -> [T, H, D]."""
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, self.k_scale, self.v_scale)
        hkv, d = k_cache.shape[-2], k_cache.shape[-1]
        if self._decode_mask is not None:
            return self._decode(q, k_cache, v_cache)
        out = torch.empty_like(q)
        for p in self._plans:
            ks = read_pages(k_cache, p.pages, q.dtype, self.k_scale).reshape(-1, hkv, d)[:p.seq_len]
            vs = read_pages(v_cache, p.pages, q.dtype, self.v_scale).reshape(-1, hkv, d)[:p.seq_len]
            qi = q[p.start:p.end].transpose(0, 1)  # [H, ext, D]; ks, vs [S, Hkv, D]
            o = F.scaled_dot_product_attention(
                qi, ks.transpose(0, 1), vs.transpose(0, 1),
                attn_mask=p.mask, is_causal=p.causal, scale=self.config.scale, enable_gqa=True)
            out[p.start:p.end] = o.transpose(0, 1)
        return out

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """One query per sequence: q [B, H, D] against each sequence's padded pages."""
        b, (hkv, d) = q.shape[0], k_cache.shape[-2:]
        ks = read_pages(k_cache, self._decode_pages, q.dtype, self.k_scale).reshape(b, -1, hkv, d)
        vs = read_pages(v_cache, self._decode_pages, q.dtype, self.v_scale).reshape(b, -1, hkv, d)
        o = F.scaled_dot_product_attention(  # ks, vs [B, S, Hkv, D]
            q[:, :, None, :], ks.transpose(1, 2), vs.transpose(1, 2),
            attn_mask=self._decode_mask, scale=self.config.scale, enable_gqa=True)  # [B, H, 1, D]
        return o[:, :, 0, :]
