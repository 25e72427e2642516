"""NCCL collectives through torch.distributed. The engine initialises the process group (backend
``platform.dist_backend`` = "nccl") when the tensor-parallel size is above 1; with one rank every
collective is the identity and no group is needed."""

from __future__ import annotations

import torch
import torch.distributed as dist
from infer.core.ops.comm import Communicator


class NcclCommunicator(Communicator):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        out = torch.empty((self.world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous())
        return torch.cat(out.unbind(0), dim=dim)
