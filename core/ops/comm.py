"""Collective communication interface (tensor and expert parallelism).

A communicator spans the ``world_size`` ranks of one tensor-parallel group; ``rank`` is this
process's index in it. Every rank calls the same collectives in the same order with tensors of
the same shape and dtype. Results are identical, bit for bit, on every rank (replicated hidden
states stay replicated, so every rank routes MoE tokens and samples the same way).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.distributed as dist


class Communicator(ABC):
    def __init__(self, world_size: int, rank: int, group: Any = None) -> None:
        self.world_size = world_size
        self.rank = rank
        self.group = group  # a torch.distributed group; None: the default group

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum across ranks (in place where possible); returns the result."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``."""

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Sum across ranks, then rank r keeps rows [r*n/w, (r+1)*n/w) of dim 0 (n divisible
        by the world size). Default: all-reduce and slice (a backend may move fewer bytes)."""
        rows = x.shape[0] // self.world_size
        return self.all_reduce(x).narrow(0, self.rank * rows, rows)

    def warmup(self) -> None:  # noqa: B027 (optional hook)
        """Called once before a graph runner captures the forward: a backend whose first
        collective sets up state that cannot be created during capture does it here."""


class ProcessGroupCommunicator(Communicator):
    """Collectives through a torch.distributed process group, whatever its backend (the executor
    initialises it with ``platform.dist_backend`` when the tensor-parallel size is above 1).
    With one rank every collective is the identity and no group is needed."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        out = torch.empty((x.shape[0] // self.world_size, *x.shape[1:]), dtype=x.dtype,
                          device=x.device)
        dist.reduce_scatter(out, list(x.contiguous().chunk(self.world_size)), group=self.group)
        return out
