"""Collective communication interface (tensor parallelism)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


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
