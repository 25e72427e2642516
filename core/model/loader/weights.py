"""Checkpoint readers: yield (name, tensor) one tensor at a time, from memory-mapped files, so
loading never holds a second full copy of the model.

Safetensors and GGUF tensors are yielded as ``CheckpointTensor``: the shape is known, nothing is
read yet. A layer narrows it to the slice its rank holds (``narrow``; ``select`` picks one expert
of a stacked tensor) and ``materialize`` reads just that slice, so a tensor-parallel rank reads
only its shard (see ``infer.core.model.layers.shard``). A GGUF slice is read from the file's
blocks and only it is dequantised; a quantized 2-D slice carries ``gguf_qtype`` and ``gguf_raw``
(uint8 [rows, bytes_per_row] of the slice) for the linear layers' GGUF seam. A split of a GGUF
weight's input columns must fall on a block boundary (``GGUFShardError`` otherwise).
``materialize`` also takes plain tensors (``.pt`` checkpoints, tests), returned as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import safe_open
from tqdm.auto import tqdm

Q = gguf.GGMLQuantizationType
Index = list  # per stored dim: (start, stop) kept, or an int (dim dropped)


class GGUFShardError(ValueError):
    """A GGUF weight cannot be split on a block boundary for this tensor-parallel size."""


class CheckpointTensor:
    """A stored tensor, not read yet, seen through a slice of it (``index``)."""

    def __init__(self, name: str, stored_shape: tuple[int, ...], index: Index | None = None) -> None:
        self.name = name
        self.stored_shape = tuple(stored_shape)
        self.index: Index = index if index is not None else [(0, n) for n in self.stored_shape]

    @property
    def shape(self) -> torch.Size:
        return torch.Size(b - a for a, b in (i for i in self.index if isinstance(i, tuple)))

    def dim(self) -> int:
        return len(self.shape)

    def _stored_dim(self, dim: int) -> int:
        kept = [d for d, i in enumerate(self.index) if isinstance(i, tuple)]
        return kept[dim]

    def _copy(self, index: Index) -> CheckpointTensor:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.index = index
        return clone

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        d = self._stored_dim(dim % self.dim())
        a, b = self.index[d]
        if start < 0 or length < 0 or a + start + length > b:
            raise ValueError(f"{self.name}: slice [{start}, {start + length}) of dim {dim} is "
                             f"outside its {b - a} entries")
        index = list(self.index)
        index[d] = (a + start, a + start + length)
        return self._copy(index)

    def select(self, dim: int, i: int) -> CheckpointTensor:
        d = self._stored_dim(dim % self.dim())
        index = list(self.index)
        index[d] = self.index[d][0] + i
        return self._copy(index)

    def __getitem__(self, i: int) -> CheckpointTensor:
        return self.select(0, i)

    def load(self) -> torch.Tensor:
        raise NotImplementedError


def materialize(t: Any) -> torch.Tensor:
    """A plain tensor for ``t`` (reading only the slice of a ``CheckpointTensor``)."""
    return t.load() if isinstance(t, CheckpointTensor) else t


def _slices(index: Index) -> tuple:
    return tuple(slice(*i) if isinstance(i, tuple) else i for i in index)


class SafetensorsTensor(CheckpointTensor):
    """Valid while its file is open, i.e. until ``iter_safetensors`` moves to the next file."""

    def __init__(self, handle: Any, name: str) -> None:
        self._slice = handle.get_slice(name)
        super().__init__(name, tuple(self._slice.get_shape()))

    def load(self) -> torch.Tensor:
        return self._slice[_slices(self.index)]


class GGUFTensor(CheckpointTensor):
    """One GGUF tensor: ``data`` is the reader's memory-mapped array (uint8 [..., rows,
    bytes_per_row] for block types, the values themselves for F32/F16/BF16); ``stored_shape`` is
    the Hugging Face order [..., out, in]. ``unpermute_heads``: llama.cpp interleaved this q/k
    weight's rows per head (``gguf_reader.unpermute``), undone on the slice read, which must hold
    whole heads."""

    def __init__(self, name: str, data: np.ndarray, qtype: Q, shape: tuple[int, ...],
                 unpermute_heads: int = 0) -> None:
        super().__init__(name, shape)
        self.data, self.qtype, self.unpermute_heads = data, qtype, unpermute_heads

    @property
    def block_weights(self) -> int:
        return gguf.GGML_QUANT_SIZES[self.qtype][0]

    def load(self) -> torch.Tensor:
        from infer.core.model.loader.gguf_quants import QUANTIZED_TYPES, dequantize
        from infer.core.model.loader.gguf_reader import unpermute

        *lead, cols = self.index
        n_in = self.stored_shape[-1]
        quantized = self.qtype in QUANTIZED_TYPES
        if self.data.shape[-1] != n_in:  # stored as bytes of blocks (also BF16: 1 x 2 bytes)
            block, block_bytes = gguf.GGML_QUANT_SIZES[self.qtype]
            a, b = cols
            if a % block or b % block:
                raise GGUFShardError(
                    f"GGUF tensor {self.name} ({self.qtype.name}, blocks of {block} weights): its "
                    f"{n_in} input columns cannot be split at [{a}, {b}), which is not on a block "
                    f"boundary; use a tensor-parallel size that splits {n_in} into multiples of "
                    f"{block}, or a non-GGUF checkpoint")
            cols = (a // block * block_bytes, b // block * block_bytes)
        raw = torch.from_numpy(np.array(self.data[_slices([*lead, cols])]))  # own copy of the slice
        out_shape = tuple(self.shape)
        if self.unpermute_heads:
            rows_total, (r0, r1) = self.stored_shape[0], self.index[0]
            per_head = rows_total // self.unpermute_heads
            if r0 % per_head or r1 % per_head:
                raise ValueError(f"{self.name}: rows [{r0}, {r1}) do not hold whole heads")
            raw = unpermute(raw, (r1 - r0) // per_head)
        weight = dequantize(raw, self.qtype, out_shape)
        if quantized and len(self.stored_shape) == 2:
            weight.gguf_qtype, weight.gguf_raw = self.qtype, raw
        return weight


def count_safetensors(files: list[Path]) -> int:
    total = 0
    for f in files:
        with safe_open(f, framework="pt") as fh:
            total += len(list(fh.keys()))
    return total


def iter_safetensors(files: list[Path], progress: bool = True) -> Iterator[tuple[str, CheckpointTensor]]:
    """(name, lazy tensor) pairs; each must be materialized before the iterator advances."""
    bar = tqdm(total=count_safetensors(files), desc="Loading weights", unit="tensor",
               disable=not progress)
    with bar:
        for f in files:
            with safe_open(f, framework="pt") as fh:
                for name in fh.keys():
                    yield name, SafetensorsTensor(fh, name)
                    bar.update(1)


def iter_pt(files: list[Path], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    for f in tqdm(files, desc="Loading weights", unit="file", disable=not progress):
        state = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
        yield from state.items()
        del state
