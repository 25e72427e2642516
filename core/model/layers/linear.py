"""Linear layers whose GEMM comes from the context's linear method.

Shapes for tensor parallelism (rank r of n): ``ColumnParallelLinear`` keeps output rows
[r*out/n, (r+1)*out/n); ``RowParallelLinear`` keeps input columns likewise and all-reduces its
output. Merged layers (``QKVParallelLinear``, ``MergedColumnParallelLinear``) stack several
checkpoint weights along the output axis; ``load(param, tensor, shard)`` copies one of them.

GGUF seam: when a loaded weight tensor carries ``gguf_qtype`` / ``gguf_raw`` attributes (set by the
GGUF reader; ``gguf_raw`` is uint8 [rows, bytes_per_row]), the layer collects them per shard and,
after loading, ``finish_loading`` sets ``layer.gguf_qtype`` (a gguf.GGMLQuantizationType) and
``layer.gguf_raw`` (rows of every shard concatenated in output order) when all shards share one
quantized type; otherwise ``gguf_qtype`` is None. ``layer.weight`` always holds the dequantised
weight, so a method may use either. Then ``linear_method.process_weights_after_loading(layer)``.
"""

from __future__ import annotations

from typing import Any

import torch
from infer.core.ops.linear import LinearMethod
from torch import nn


class LinearBase(nn.Module):
    """out_features/in_features are this rank's sizes; ``shards`` maps a shard id to its
    (row offset, rows) in this rank's weight, in output order."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, method: LinearMethod,
                 shards: dict[Any, tuple[int, int]] | None = None, tp_rank: int = 0,
                 tp_size: int = 1, split_input: bool = False, split_output: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.method = method
        self.shards = shards or {None: (0, out_features)}
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.split_input, self.split_output = split_input, split_output
        self.gguf_qtype: Any = None
        self.gguf_raw: torch.Tensor | None = None
        self._gguf_parts: dict[Any, tuple[Any, torch.Tensor]] = {}
        method.create_weights(self, in_features, out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)  # [..., in] -> [..., out]

    def load(self, param: str, loaded: torch.Tensor, shard: Any = None) -> None:
        """Copy one checkpoint tensor (full, unsharded) into this rank's slice of ``param``."""
        target = getattr(self, param)
        offset, rows = self.shards[shard]
        raw = getattr(loaded, "gguf_raw", None)  # read before narrow() drops the attribute
        qtype = getattr(loaded, "gguf_qtype", None)
        if self.split_output:
            loaded = loaded.narrow(0, self.tp_rank * rows, rows)
        if self.split_input and param == "weight":
            cols = self.in_features
            loaded = loaded.narrow(1, self.tp_rank * cols, cols)
        dest = target.data.narrow(0, offset, rows)
        if dest.shape != loaded.shape:
            raise ValueError(f"weight shape mismatch for {param} shard {shard}: checkpoint "
                             f"{tuple(loaded.shape)}, model {tuple(dest.shape)}")
        dest.copy_(loaded)
        if param == "weight" and raw is not None and self.tp_size == 1:
            self._gguf_parts[shard] = (qtype, raw)

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
        super().__init__(in_features, out_features // ctx.tp_size, bias=bias,
                         method=ctx.linear_method, tp_rank=ctx.tp_rank, tp_size=ctx.tp_size,
                         split_output=True)


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel weights stacked on the output axis, shard ids 0, 1, ..."""

    def __init__(self, in_features: int, out_sizes: list[int], *, bias: bool, ctx: Any) -> None:
        sizes = [s // ctx.tp_size for s in out_sizes]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        super().__init__(in_features, sum(sizes), bias=bias, method=ctx.linear_method,
                         shards={i: (o, s) for i, (o, s) in enumerate(zip(offsets, sizes, strict=False))},
                         tp_rank=ctx.tp_rank, tp_size=ctx.tp_size, split_output=True)


class QKVParallelLinear(LinearBase):
    """q, k, v projections stacked: rows [H*D | Hkv*D | Hkv*D] on this rank, shards "q"/"k"/"v"."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, *,
                 bias: bool, ctx: Any) -> None:
        if num_heads % ctx.tp_size or num_kv_heads % ctx.tp_size:
            raise ValueError(f"tensor-parallel size {ctx.tp_size} must divide the number of "
                             f"attention heads ({num_heads}) and KV heads ({num_kv_heads})")
        q, kv = num_heads // ctx.tp_size * head_dim, num_kv_heads // ctx.tp_size * head_dim
        super().__init__(hidden, q + 2 * kv, bias=bias, method=ctx.linear_method,
                         shards={"q": (0, q), "k": (q, kv), "v": (q + kv, kv)},
                         tp_rank=ctx.tp_rank, tp_size=ctx.tp_size, split_output=True)


class RowParallelLinear(LinearBase):
    """Input split across ranks; partial outputs all-reduced (identity with one rank)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, ctx: Any) -> None:
        super().__init__(in_features // ctx.tp_size, out_features, bias=bias,
                         method=ctx.linear_method, tp_rank=ctx.tp_rank, tp_size=ctx.tp_size,
                         split_input=True)
        self.comm = ctx.comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.method.apply(self, x))
