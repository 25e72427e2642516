"""Linear layers whose GEMM comes from the context's linear method.

Shapes for tensor parallelism (rank r of n, see ``infer.core.model.layers.shard``):
``ColumnParallelLinear`` keeps output rows [r*out/n, (r+1)*out/n); ``RowParallelLinear`` keeps
input columns likewise and all-reduces its output (its bias is added on rank 0 only: the other
ranks hold zeros). Merged layers (``QKVParallelLinear``, ``MergedColumnParallelLinear``) stack
several checkpoint weights along the output axis; ``load(param, tensor, shard)`` narrows one of
them to this rank's rows (and columns) and copies it. The KV rows of ``QKVParallelLinear`` are
those of the rank's KV head(s), replicated when n exceeds the KV heads.

GGUF seam: when a loaded weight tensor carries ``gguf_qtype`` / ``gguf_raw`` attributes (set by the
GGUF reader on the slice it read; ``gguf_raw`` is uint8 [rows, bytes_per_row]), the layer collects
them per shard and, after loading, ``finish_loading`` sets ``layer.gguf_qtype`` (a
gguf.GGMLQuantizationType) and ``layer.gguf_raw`` (rows of every shard concatenated in output
order) when all shards share one quantized type; otherwise ``gguf_qtype`` is None.
``layer.weight`` always holds the dequantised weight, so a method may use either. Then
``linear_method.process_weights_after_loading(layer)``.
"""

from __future__ import annotations

from typing import Any

import torch
from infer.core.model.layers.shard import Slice, even_split, kv_head_slice
from infer.core.model.loader.weights import materialize
from infer.core.ops.linear import LinearMethod
from torch import nn


class LinearBase(nn.Module):
    """out_features/in_features are this rank's sizes; ``shards`` maps a shard id to (row offset
    in this rank's weight, rows of the checkpoint tensor this rank holds or None for all), in
    output order; ``input_slice``: the checkpoint columns this rank holds (None: all)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, method: LinearMethod,
                 shards: dict[Any, tuple[int, Slice | None]] | None = None,
                 input_slice: Slice | None = None, tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.method = method
        self.shards = shards or {None: (0, None)}
        self.input_slice = input_slice
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.gguf_qtype: Any = None
        self.gguf_raw: torch.Tensor | None = None
        self._gguf_parts: dict[Any, tuple[Any, torch.Tensor]] = {}
        method.create_weights(self, in_features, out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)  # [..., in] -> [..., out]

    def load(self, param: str, loaded: Any, shard: Any = None) -> None:
        """Copy this rank's slice of one checkpoint tensor (full, unsharded; a plain tensor or a
        lazy ``CheckpointTensor``, of which only the slice is read) into ``param``."""
        target = getattr(self, param)
        offset, rows = self.shards[shard]
        if rows is not None:
            loaded = loaded.narrow(0, rows.start, rows.size)
        if self.input_slice is not None and param == "weight":
            loaded = loaded.narrow(1, self.input_slice.start, self.input_slice.size)
        loaded = materialize(loaded)
        dest = target.data.narrow(0, offset, rows.size if rows is not None else target.shape[0])
        if dest.shape != loaded.shape:
            raise ValueError(f"weight shape mismatch for {param} shard {shard}: checkpoint "
                             f"{tuple(loaded.shape)}, model {tuple(dest.shape)}")
        if param == "bias" and self.input_slice is not None and self.tp_rank != 0:
            dest.zero_()  # a row-parallel bias is added once, by rank 0, before the all-reduce
        else:
            dest.copy_(loaded)
        raw = getattr(loaded, "gguf_raw", None)  # on the slice read (or an unsliced tensor)
        if param == "weight" and raw is not None:
            self._gguf_parts[shard] = (loaded.gguf_qtype, raw)

    def finish_loading(self) -> None:
        """Expose GGUF raw blocks (see module doc), then let the method post-process."""
        parts = [self._gguf_parts.get(s) for s in self.shards]
        self._gguf_parts = {}
        if parts and all(p is not None for p in parts) and len({p[0] for p in parts}) == 1:
            self.gguf_qtype = parts[0][0]
            self.gguf_raw = parts[0][1] if len(parts) == 1 else torch.cat([p[1] for p in parts])
        self.method.process_weights_after_loading(self)


class ReplicatedLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, *, bias: bool,
                 method: LinearMethod) -> None:
        super().__init__(in_features, out_features, bias=bias, method=method)


class ColumnParallelLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, *, bias: bool, ctx: Any) -> None:
        rows = even_split(out_features, ctx.tp_size, ctx.tp_rank)
        super().__init__(in_features, rows.size, bias=bias, method=ctx.linear_method,
                         shards={None: (0, rows)}, tp_rank=ctx.tp_rank, tp_size=ctx.tp_size)


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel weights stacked on the output axis, shard ids 0, 1, ..."""

    def __init__(self, in_features: int, out_sizes: list[int], *, bias: bool, ctx: Any) -> None:
        rows = [even_split(s, ctx.tp_size, ctx.tp_rank) for s in out_sizes]
        offsets = [sum(r.size for r in rows[:i]) for i in range(len(rows))]
        super().__init__(in_features, sum(r.size for r in rows), bias=bias,
                         method=ctx.linear_method,
                         shards={i: (o, r) for i, (o, r) in enumerate(zip(offsets, rows, strict=True))},
                         tp_rank=ctx.tp_rank, tp_size=ctx.tp_size)


class QKVParallelLinear(LinearBase):
    """q, k, v projections stacked: rows [H*D | Hkv*D | Hkv*D] on this rank (this rank's query
    heads and KV heads), shards "q"/"k"/"v"."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, *,
                 bias: bool, ctx: Any) -> None:
        try:
            q_heads = even_split(num_heads, ctx.tp_size, ctx.tp_rank)
            kv_heads = kv_head_slice(num_kv_heads, ctx.tp_size, ctx.tp_rank)
        except ValueError as exc:
            raise ValueError(f"tensor-parallel size {ctx.tp_size} cannot split {num_heads} "
                             f"attention heads / {num_kv_heads} KV heads: {exc}") from exc
        q = Slice(q_heads.start * head_dim, q_heads.size * head_dim)
        kv = Slice(kv_heads.start * head_dim, kv_heads.size * head_dim)
        super().__init__(hidden, q.size + 2 * kv.size, bias=bias, method=ctx.linear_method,
                         shards={"q": (0, q), "k": (q.size, kv), "v": (q.size + kv.size, kv)},
                         tp_rank=ctx.tp_rank, tp_size=ctx.tp_size)


class RowParallelLinear(LinearBase):
    """Input split across ranks; partial outputs all-reduced (identity with one rank)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, ctx: Any) -> None:
        cols = even_split(in_features, ctx.tp_size, ctx.tp_rank)
        super().__init__(cols.size, out_features, bias=bias, method=ctx.linear_method,
                         input_slice=cols if ctx.tp_size > 1 else None,
                         tp_rank=ctx.tp_rank, tp_size=ctx.tp_size)
        self.comm = ctx.comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.method.apply(self, x))
