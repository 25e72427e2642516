"""Collective communication interface (tensor parallelism)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.distributed as dist


class Communicator(ABC):
    def __init__(self, world_size: int, rank: int) -> None:
        self.world_size = world_size
        self.rank = rank

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum across ranks (in place where possible); returns the result."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``."""


class ProcessGroupCommunicator(Communicator):
    """Collectives through torch.distributed's default process group, whatever its backend
    (the engine initialises it with ``platform.dist_backend`` when the tensor-parallel size is
    above 1). With one rank every collective is the identity and no group is needed."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=dim)
