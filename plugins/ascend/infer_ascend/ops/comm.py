"""HCCL collectives through torch.distributed (the engine initialises the process group with
the platform's ``dist_backend``, "hccl"). Both collectives write into preallocated tensors with
one call each, so they can be captured in an ACL graph."""

from __future__ import annotations

import torch
import torch.distributed as dist
from infer.core.ops.comm import Communicator


class HcclCommunicator(Communicator):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's x concatenated along ``dim``: one all_gather_into_tensor into
        [W * x.shape[0], ...] (rank-major along dim 0), re-split when ``dim`` is another."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        out = torch.empty((self.world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype,
                          device=x.device)
        dist.all_gather_into_tensor(out, x)
        if dim in (0, -x.dim()):
            return out
        return torch.cat(out.chunk(self.world_size, dim=0), dim=dim)
