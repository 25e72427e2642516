"""``flashinfer`` attention backend: FlashInfer's paged prefill / decode wrappers.

The wrappers are planned once per batch in ``plan`` (page lists built from the block tables) and
run once per layer. Our cache layout [num_pages, page_size, Hkv, D] is FlashInfer's "NHD". q and k
are rotated, and k/v written, by our Triton rope + store kernel first. FlashInfer runs fp16/bf16
only, with the cache in the model dtype (an fp8 KV cache is refused: use triton); graph capture
is not wired for it (its decode wrapper needs fixed-size CUDA-graph buffers), so the graph runner
runs it eagerly.
"""

from __future__ import annotations

import torch
from infer.core.ops.attention import (
    AttentionBackend,
    AttentionConfig,
    AttentionMetadata,
    RotaryArgs,
)

from infer_cuda.kernels.kv_store import write_new_kv

WORKSPACE_BYTES = 128 * 2**20


def paged_kv_indices(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page lists: (indptr [B+1] int32, indices [sum pages] int32,
    last_page_len [B] int32) from block_tables [B, max_pages] and seq_lens [B]."""
    page = meta.page_size
    seq_lens = meta.seq_lens.to(torch.int32)
    num_pages = (seq_lens + page - 1) // page  # [B]
    indptr = torch.zeros(meta.num_seqs + 1, dtype=torch.int32, device=seq_lens.device)
    indptr[1:] = torch.cumsum(num_pages, 0)
    cols = torch.arange(meta.block_tables.shape[1], device=seq_lens.device)
    indices = meta.block_tables[cols[None, :] < num_pages[:, None]].to(torch.int32)
    last = seq_lens - (num_pages - 1) * page
    return indptr, indices, last


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"
    supports_graph_capture = False
    fuses_rotary = True

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        if config.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"--attention-backend flashinfer runs fp16/bf16 only, not {config.dtype}; "
                             "use --attention-backend triton")
        if config.kv_dtype != config.dtype:
            raise NotImplementedError(
                f"--attention-backend flashinfer with a {config.kv_dtype} KV cache is not implemented "
                f"(only a cache in the model dtype is wired and tested); use --attention-backend "
                f"triton for --kv-cache-dtype fp8_e4m3 / fp8_e5m2")
        import flashinfer

        self.k_scale = 1.0
        self.v_scale = 1.0
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=config.device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._is_decode = False

    def plan(self, meta: AttentionMetadata) -> None:
        super().plan(meta)
        c = self.config
        indptr, indices, last = paged_kv_indices(meta)
        self._is_decode = meta.is_decode_only
        common = dict(q_data_type=c.dtype, kv_data_type=c.kv_dtype, sm_scale=c.scale)
        if self._is_decode:
            self._decode.plan(indptr, indices, last, c.num_heads, c.num_kv_heads, c.head_dim,
                              c.page_size, **common)
        else:
            self._prefill.plan(meta.query_start_loc.to(torch.int32), indptr, indices, last,
                               c.num_heads, c.num_kv_heads, c.head_dim, c.page_size,
                               causal=True, **common)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int,
                rotary: RotaryArgs | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D], caches [P, page, Hkv, D] -> [T, H, D]."""
        assert self.meta is not None, "plan() must run before forward()"
        q = write_new_kv(q, k, v, rotary, k_cache, v_cache, self.meta.slot_mapping, self.k_scale,
                         self.v_scale).contiguous()  # our kernels first, then FlashInfer's
        wrapper = self._decode if self._is_decode else self._prefill
        return wrapper.run(q, (k_cache, v_cache))
