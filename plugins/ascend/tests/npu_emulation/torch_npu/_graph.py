"""Emulated ACL graphs (``torch.npu.NPUGraph``): capture records every op, replay re-runs them.

Document: Ascend Extension for PyTorch, "torch.npu.NPUGraph" / "torch.npu.graph" (hiascend.com,
ACLGraph chapter of the PyTorch graph-mode guide) and SGLang's NPU graph runner, which captures
with ``torch.npu.graph(g, pool=, stream=, auto_dispatch_capture=True)`` and, before each
``g.replay()``, calls ``g.update(cpu_update_input=[{"actual_seq_lengths_kv": lens}, ...])``.
Facts emulated:
  * A captured graph replays the same kernels on the same memory: device-tensor inputs are read
    afresh at replay (the caller copies new contents into the static buffers), while every
    host-side value (Python ints and lists baked into a kernel's launch) stays as captured.
  * Host-side arguments of ops captured with ``auto_dispatch_capture=True`` (here: the fused
    attention's sequence-length lists) are changed only through ``update``: one dict per such op
    record, in capture order ({} leaves a record as it was).
  * Reading a device value on the host (``.item()``, ``.tolist()``) during capture is an error.
  * Collectives captured in the graph (HCCL all-reduce of tensor parallelism) run in stream
    order at replay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

_ACTIVE: list[_Recorder] = []


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[list[Any]] = []  # [kind, fn, args, kwargs, out, updatable]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._local_scalar_dense.default:
            raise RuntimeError("reading a device value on the host during graph capture")
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.records.append(["aten", func, args, kwargs, out, ()])
        return out


def recorded(updatable: tuple[str, ...] = ()) -> Callable:
    """Decorator of an emulated op: inside a capture the op is recorded as ONE kernel (its own
    inner torch calls are not), with ``updatable`` naming its host-side arguments."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def op(*args: Any, **kwargs: Any) -> Any:
            if not _ACTIVE:
                return fn(*args, **kwargs)
            rec = _ACTIVE[-1]
            with _disable_current_modes():
                out = fn(*args, **kwargs)
            rec.records.append(["npu", fn, args, dict(kwargs), out, updatable])
            return out
        return op
    return wrap


def _wait_collectives(new: Any) -> None:
    """A collective (c10d.allreduce_, ...) returns a Work handle that eager code waits on right
    after the call; on the device a captured collective is ordered on the stream, so the replay
    waits before the next op reads its result."""
    if isinstance(new, (tuple, list)):
        for item in new:
            _wait_collectives(item)
    elif not isinstance(new, torch.Tensor) and callable(getattr(new, "wait", None)):
        new.wait()


def _copy_into(old: Any, new: Any) -> None:
    if isinstance(old, torch.Tensor):
        if old is not new and old.data_ptr() != new.data_ptr():
            old.copy_(new)
    elif isinstance(old, (tuple, list)):
        for o, n in zip(old, new, strict=True):
            _copy_into(o, n)


class NPUGraph:
    """torch.npu.NPUGraph: capture once, ``replay()`` many times, ``update()`` host arguments."""

    def __init__(self) -> None:
        self._records: list[list[Any]] | None = None
        self._dispatch_capture = False

    def replay(self) -> None:
        if self._records is None:
            raise RuntimeError("replay() of a graph that was never captured")
        with torch.inference_mode():  # a replay records no autograd history
            for _kind, fn, args, kwargs, out, _ in self._records:
                new = fn(*args, **kwargs)
                _wait_collectives(new)
                _copy_into(out, new)

    def update(self, cpu_update_input: list[dict[str, Any]]) -> None:
        if not self._dispatch_capture:
            raise RuntimeError("update() needs a graph captured with auto_dispatch_capture=True")
        targets = [r for r in self._records or [] if r[5]]
        if len(cpu_update_input) != len(targets):
            raise ValueError(f"cpu_update_input has {len(cpu_update_input)} entries for "
                             f"{len(targets)} updatable op records")
        for rec, upd in zip(targets, cpu_update_input, strict=True):
            for name, value in upd.items():
                if name not in rec[5]:
                    raise ValueError(f"{name!r} is not an updatable argument of {rec[1].__name__}")
                rec[3][name] = list(value) if not isinstance(value, torch.Tensor) else value

    def reset(self) -> None:
        self._records = None


class graph:  # noqa: N801 (torch.npu.graph is a class used as a context manager)
    def __init__(self, npu_graph: NPUGraph, pool: Any = None, stream: Any = None,
                 auto_dispatch_capture: bool = False, **_: Any) -> None:
        self.g = npu_graph
        self.g._dispatch_capture = auto_dispatch_capture
        self.rec = _Recorder()

    def __enter__(self) -> NPUGraph:
        _ACTIVE.append(self.rec)
        self.rec.__enter__()
        return self.g

    def __exit__(self, *exc: Any) -> None:
        self.rec.__exit__(*exc)
        _ACTIVE.pop()
        self.g._records = self.rec.records


def graph_pool_handle() -> tuple[int, int]:
    return (0, 0)
