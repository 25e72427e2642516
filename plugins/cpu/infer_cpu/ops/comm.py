"""Collectives through torch.distributed (gloo). The engine initialises the process group when
the tensor-parallel size is above 1; with one rank every collective is the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist
from infer.core.ops.comm import Communicator


class GlooCommunicator(Communicator):
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
