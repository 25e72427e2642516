"""Attention backend interface and the per-batch metadata it reads.

KV cache layout (one pair of tensors per layer, owned by the model runner):
    k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim]
A token slot is ``page * page_size + offset``; flattened views are [num_slots, Hkv, D].

A batch is a list of sequences; sequence ``i`` contributes ``extend_lens[i]`` new tokens (1 for a
decode row, more for a prefill or a chunk of one) whose queries attend causally to its
``prefix_lens[i]`` cached tokens plus the new ones. New tokens of all sequences are packed along
the token axis in sequence order: sequence i owns rows query_start_loc[i]:query_start_loc[i+1].
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionConfig:
    num_heads: int  # query heads on this rank
    num_kv_heads: int
    head_dim: int
    scale: float
    page_size: int
    dtype: torch.dtype  # activation dtype
    kv_dtype: torch.dtype  # KV cache storage dtype
    device: torch.device
    num_layers: int
    max_batch_size: int = 256
    max_context_len: int = 4096
    # --enable-deterministic-inference: each query row reduced over its keys in a fixed order,
    # whatever the prefill/extend/decode split and the batch; a backend that cannot refuses
    deterministic: bool = False


@dataclass
class AttentionMetadata:
    """Built once per batch by the model runner. Device tensors unless named *_cpu."""

    num_seqs: int
    num_tokens: int
    page_size: int
    query_start_loc: torch.Tensor  # [B+1] int32, cumulative extend_lens
    seq_lens: torch.Tensor  # [B] int32, kv length after this step (prefix + extend)
    prefix_lens: torch.Tensor  # [B] int32, cached tokens before this step
    block_tables: torch.Tensor  # [B, max_pages] int32 page ids; rows padded with 0
    slot_mapping: torch.Tensor  # [T] int64 slot where each new token's k/v is written
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    max_seq_len: int
    max_extend_len: int

    @property
    def is_decode_only(self) -> bool:
        return self.max_extend_len == 1 and self.num_tokens == self.num_seqs

    @property
    def prefix_lens_cpu(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens_cpu, self.extend_lens_cpu, strict=True)]


@dataclass(frozen=True)
class RotaryArgs:
    """What a backend that fuses rotary needs to rotate q and k itself (see ``fuses_rotary``)."""

    positions: torch.Tensor  # [T] int64
    cos_sin: torch.Tensor  # [P, R] float32: first half cos, second half sin (``rope_table``)
    rotary_dim: int  # R: rotate-half over the first R dims of each head, the rest pass through


@dataclass
class KVCache:
    """All layers' caches, allocated once by the model runner: k[i], v[i] are
    [num_pages, page_size, num_kv_heads, head_dim] for layer i."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def num_pages(self) -> int:
        return self.k[0].shape[0]

    @property
    def page_size(self) -> int:
        return self.k[0].shape[1]


class AttentionBackend(ABC):
    """One per model. ``plan`` runs once per batch, ``forward`` once per layer.

    ``forward`` must first write the new keys/values into the cache at ``slot_mapping``, then
    return attention over prefix + new tokens. Shapes: q [T, H, D], k and v [T, Hkv, D],
    output [T, H, D] in q's dtype. Graph-capturable backends keep ``plan``'s device writes in
    place (same tensors, new contents) so that a captured graph stays valid.

    A backend with ``fuses_rotary`` set may be given ``rotary``: then q and k arrive before the
    rotary embedding (views into the fused QKV projection: token and head strides arbitrary, head
    dims contiguous) and the backend rotates them itself, e.g. in the kernel that writes the cache,
    saving the separate rotary launches. Without ``rotary`` it gets rotated q and k as usual.
    """

    name: str = ""
    supports_graph_capture: bool = False
    fuses_rotary: bool = False

    def __init__(self, config: AttentionConfig) -> None:
        self.config = config
        self.meta: AttentionMetadata | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare for one batch (index arithmetic, wrapper planning). Called once per batch."""
        self.meta = meta

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int,
                rotary: RotaryArgs | None = None) -> torch.Tensor:
        """Write k/v at the batch's slots, return attention output [T, H, D]. ``rotary``: only
        for backends with ``fuses_rotary`` (q and k not yet rotated)."""


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Plain-torch KV write: k/v [T, Hkv, D] into caches [P, page, Hkv, D] at slot_mapping [T].
    An fp8 cache stores value / scale saturated to the fp8 range (as the Triton store does)."""
    hkv, d = k_cache.shape[-2], k_cache.shape[-1]
    for new, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        flat = cache.view(-1, hkv, d)
        if cache.dtype in FP8_DTYPES:
            qmax = torch.finfo(cache.dtype).max
            q = (new.float() / scale).clamp(-qmax, qmax).to(cache.dtype)
            # byte views: index_copy_ has no fp8 kernel on every device
            flat.view(torch.uint8).index_copy_(0, slot_mapping, q.view(torch.uint8))
        else:
            flat.index_copy_(0, slot_mapping, new.to(cache.dtype))


def read_pages(cache: torch.Tensor, pages: torch.Tensor, dtype: torch.dtype,
               scale: float = 1.0) -> torch.Tensor:
    """Pages [n] of a cache [P, page, Hkv, D] -> [n, page, Hkv, D] in ``dtype``; an fp8 cache is
    read back as stored value * scale (computed in float32)."""
    if cache.dtype not in FP8_DTYPES:
        return cache.index_select(0, pages).to(dtype)
    stored = cache.view(torch.uint8).index_select(0, pages).view(cache.dtype)
    if scale == 1.0:
        return stored.to(dtype)
    return (stored.float() * scale).to(dtype)
