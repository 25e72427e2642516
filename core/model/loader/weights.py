"""Checkpoint readers: yield (name, tensor) one tensor at a time, from memory-mapped files, so
loading never holds a second full copy of the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm


def count_safetensors(files: list[Path]) -> int:
    total = 0
    for f in files:
        with safe_open(f, framework="pt") as fh:
            total += len(list(fh.keys()))
    return total


def iter_safetensors(files: list[Path], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    bar = tqdm(total=count_safetensors(files), desc="Loading weights", unit="tensor",
               disable=not progress)
    with bar:
        for f in files:
            with safe_open(f, framework="pt") as fh:
                for name in fh.keys():
                    yield name, fh.get_tensor(name)
                    bar.update(1)


def iter_pt(files: list[Path], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    for f in tqdm(files, desc="Loading weights", unit="file", disable=not progress):
        state = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
        yield from state.items()
        del state
