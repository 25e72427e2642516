"""Communicators against the definitions of their collectives.

With one rank every collective is the identity (no process group). With two ranks (two processes
started with torch.multiprocessing, a process group of the communicator's backend, rank r on
device index r, or both on the host device) rank r contributes ``base * (r + 1)`` to all_reduce,
which must return ``3 * base`` on both, and ``x_r`` to all_gather, which must return
``cat([x_0, x_1], dim)`` for dim -1 and 0. Two ranks need two devices unless the platform's
device is the host's.
"""

from __future__ import annotations

import datetime
import tempfile
from pathlib import Path
from typing import Any

import torch
from infer.core.plugins import load_target
from infer.core.testing.batches import rel_err
from infer.core.testing.outcome import ConformanceFailure, OpRefused, Outcome, Tolerances, build

SHAPE = (3, 40)
WORLD = 2


def _tensors(dtype: torch.dtype, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, x_rank): the same base on every rank, each rank's own x."""
    base = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7)).to(dtype)
    return base, torch.randn(SHAPE, generator=torch.Generator().manual_seed(100 + rank)).to(dtype)


def _check_collectives(comm: Any, rank: int, world: int, device: torch.device, dtype: torch.dtype,
                       bound: float) -> None:
    """Raises ConformanceFailure on rank ``rank`` of ``world`` (1 or 2)."""
    base, _ = _tensors(dtype, rank)
    got = comm.all_reduce((base * (rank + 1)).to(device))
    expect = base.float() * sum(r + 1 for r in range(world))
    err = rel_err(got, expect)
    if got.dtype != dtype or not err <= bound:
        raise ConformanceFailure(f"rank {rank}/{world} all_reduce: dtype {got.dtype}, relative "
                                 f"error {err:.3g} against the sum (bound {bound:g})")
    parts = [_tensors(dtype, r)[1] for r in range(world)]
    for dim in (-1, 0):
        got = comm.all_gather(parts[rank].to(device), dim=dim)
        expect = torch.cat(parts, dim=dim)
        if tuple(got.shape) != tuple(expect.shape) or not torch.equal(got.cpu(), expect):
            raise ConformanceFailure(f"rank {rank}/{world} all_gather(dim={dim}): shape "
                                     f"{tuple(got.shape)}, expected the ranks' tensors "
                                     f"concatenated {tuple(expect.shape)}")


def _rank_main(rank: int, target: Any, backend: str, device_type: str, count: int,
               init_file: str, dtype_names: list[str], bounds: list[float]) -> None:
    """One rank of the two-process check (module level: torch.multiprocessing pickles it)."""
    import torch.distributed as dist

    device = torch.device(device_type) if count == 0 else torch.device(device_type, rank % count)
    if count:
        torch.get_device_module(device_type).set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    try:
        comm = load_target(target)(WORLD, rank)
        for name, bound in zip(dtype_names, bounds, strict=True):
            _check_collectives(comm, rank, WORLD, device, getattr(torch, name), bound)
    finally:
        dist.destroy_process_group()


def check_communicator(key: str, factory: Any, device: torch.device, host_device: bool,
                       device_count: int, dtypes: tuple[torch.dtype, ...], tol: Tolerances,
                       ranks: tuple[int, ...] = (1, 2)) -> Outcome:
    """``factory`` may be a ``"module:attr"`` string (the two-rank check imports it in each
    process; an object must be importable there by its module and name)."""
    outcome = Outcome(f"communicator {key!r}")
    if 1 in ranks:
        for dtype in dtypes:
            with outcome.case(f"1 rank {str(dtype)[6:]}"):
                _check_collectives(build(load_target(factory), 1, 0), 0, 1, device, dtype,
                                   tol.for_dtype(dtype))
    if 2 in ranks:
        with outcome.case(f"{WORLD} ranks over {key!r}"):
            _two_ranks(key, factory, device, host_device, device_count, dtypes, tol)
    return outcome.raise_if_failed()


def _two_ranks(key: str, factory: Any, device: torch.device, host_device: bool, device_count: int,
               dtypes: tuple[torch.dtype, ...], tol: Tolerances) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_backend_available(key):
        raise OpRefused(f"torch.distributed has no backend {key!r} in this build")
    if not host_device and device_count < WORLD:
        raise OpRefused(f"{WORLD} ranks need {WORLD} devices; {device_count} found")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.start_processes(_rank_main, nprocs=WORLD, join=True, start_method="spawn", args=(
                factory, key, device.type, 0 if host_device else device_count,
                str(Path(tmp) / "rendezvous"), [str(d)[6:] for d in dtypes],
                [tol.for_dtype(d) for d in dtypes]))
        except mp.ProcessRaisedException as e:
            last = [line for line in str(e).strip().splitlines() if line.strip()][-1]
            raise ConformanceFailure(f"a rank failed: {last}") from None
