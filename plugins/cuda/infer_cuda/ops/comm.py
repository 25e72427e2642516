"""NCCL collectives through torch.distributed, safe inside CUDA graphs.

Capture rules (CUDA graphs record NCCL kernels since NCCL 2.9.6; torch's NCCL process group
handles a capturing stream): every collective is issued on the current stream with no host
synchronisation and no Python-side decision that depends on tensor contents; outputs are
allocated with ``torch.empty`` (from the graph's memory pool while capturing) and reshaped
without a host round trip. NCCL creates its communicator lazily on the first collective, which
must not happen during capture: ``warmup`` (called by a graph runner before it captures) runs
one all-reduce and one all-gather eagerly. Single-tensor all-gather and reduce-scatter
(``*_into_tensor`` / ``reduce_scatter_tensor``) use one output buffer instead of world_size.

Under ``--enable-torch-compile`` the collectives are left out of tracing (``torch.compiler.disable``,
as the Triton attention and MoE launchers are): Dynamo breaks the graph around them and they run
as the eager code above, which the CUDA graph then records like any other kernel launch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from infer.core.ops.comm import ProcessGroupCommunicator


class NcclCommunicator(ProcessGroupCommunicator):
    @torch.compiler.disable
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return super().all_reduce(x)

    @torch.compiler.disable
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        return self._all_gather(x, dim)

    def _all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        out = torch.empty((self.world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous(), group=self.group)
        d = dim % x.dim()
        return out.movedim(0, d).reshape(*x.shape[:d], -1, *x.shape[d + 1:])  # [.., W*n, ..]

    @torch.compiler.disable
    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        out = torch.empty((x.shape[0] // self.world_size, *x.shape[1:]), dtype=x.dtype,
                          device=x.device)
        dist.reduce_scatter_tensor(out, x.contiguous(), group=self.group)
        return out

    def warmup(self) -> None:
        if self.world_size == 1:
            return
        x = torch.ones(8, device=torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(x, group=self.group)
        self._all_gather(x, 0)
        torch.cuda.synchronize()
