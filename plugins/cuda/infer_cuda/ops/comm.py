"""NCCL collectives through torch.distributed: the core's process-group communicator with
NCCL's single-tensor all-gather (one output buffer instead of world_size separate ones)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from infer.core.ops.comm import ProcessGroupCommunicator


class NcclCommunicator(ProcessGroupCommunicator):
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        out = torch.empty((self.world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous())
        return torch.cat(out.unbind(0), dim=dim)
