"""Emulated ``torch.npu`` namespace (``torch_npu.npu``; importing torch_npu makes it
``torch.npu``): one host-backed device whose name, count and memory the test sets.

Document: Ascend Extension for PyTorch API reference, "torch_npu.npu" device management, memory
management and stream/event APIs (hiascend.com), which mirror ``torch.cuda``'s: device_count,
get_device_name, set_device, current_device, synchronize, mem_get_info, memory_reserved, Stream,
Event, current_stream, stream, NPUGraph, graph, graph_pool_handle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ._graph import NPUGraph, graph, graph_pool_handle

__all__ = ["NPUGraph", "graph", "graph_pool_handle"]

# set by the test's install(): what this emulated machine reports
DEVICE = {"name": "Ascend910B3", "count": 4, "total": 64 << 30, "free": 60 << 30}
_current = [0]


def is_available() -> bool:
    """False, unlike on a real NPU machine: other libraries in the test process (transformers
    computing the reference logits) would otherwise route their own work to torch_npu kernels
    that the emulation does not have. infer's plugin never asks."""
    return False


def device_count() -> int:
    return int(DEVICE["count"])


def get_device_name(device: Any = None) -> str:
    return str(DEVICE["name"])


def set_device(device: Any) -> None:
    index = device if isinstance(device, int) else int(str(device).split(":")[-1] or 0)
    if not 0 <= index < device_count():
        raise RuntimeError(f"invalid device ordinal {index}")
    _current[0] = index


def current_device() -> int:
    return _current[0]


def synchronize(device: Any = None) -> None:
    """Everything already ran: the emulation executes ops eagerly on the host."""


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return int(DEVICE["free"]), int(DEVICE["total"])


def memory_reserved(device: Any = None) -> int:
    return 0


def empty_cache() -> None:
    """No caching allocator to release."""


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        if not self.recorded:
            raise RuntimeError("synchronize() on an event that was never recorded")

    def query(self) -> bool:
        return self.recorded


class Stream:
    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.waited: list[Any] = []

    def wait_stream(self, other: Any) -> None:
        self.waited.append(other)

    def wait_event(self, event: Event) -> None:
        self.waited.append(event)

    def synchronize(self) -> None:
        """Host-backed: nothing is queued."""


_default_stream = Stream()
_stream_stack: list[Stream] = [_default_stream]


def current_stream(device: Any = None) -> Stream:
    return _stream_stack[-1]


@contextlib.contextmanager
def stream(s: Stream) -> Iterator[None]:
    _stream_stack.append(s)
    try:
        yield
    finally:
        _stream_stack.pop()
