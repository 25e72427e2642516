"""Argument checks shared by the emulated ops: each raises the way a wrong call would fail on
the device (a TypeError/ValueError naming the argument), so that a wrong assumption in the plugin
fails here instead of agreeing with itself."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def dtype_in(name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if t.dtype not in allowed:
        raise TypeError(f"{name}: dtype {t.dtype} not supported (allowed: {list(allowed)})")


def host_ints(name: str, value: object) -> list[int]:
    """A SymInt[] argument: a host-side list/tuple of Python ints (a device tensor is refused:
    the op reads these on the host when it tiles the work)."""
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a host list of ints, got a tensor")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise TypeError(f"{name}: expected a list of ints, got {type(value).__name__}")
    return list(value)
