"""Transparent huge pages for the CPU plugin's large, long-lived buffers: the KV cache and the
native stacks' weights.

Where Linux runs transparent huge pages in ``madvise`` mode (the common default, and this
project's machines), torch's allocations stay on 4 KB pages: a decode step's scattered key and
value rows and its streamed weights then walk the page tables for nearly every 4 KB they touch.
Placed in private anonymous mappings advised with ``MADV_HUGEPAGE`` before they are first written,
the same buffers are backed by 2 MB pages (the whole 2 MB-aligned interior of each). The bf16
engine's 32-row decode steps took 17.1 ms against 18.5-19.1 on 4 KB pages, its output rate
1.06x at 32 running requests and 1.06-1.07x at 8 (``benchmarks/cpu_vllm_notes.md``, session 35);
start-up takes about 0.8 s longer (the kernel clears the 2 MB pages as the KV cache is zeroed).
In ``always`` mode the kernel does this itself; in ``never`` mode, or off Linux, nothing changes.
Values never change: only where they live. ``INFER_CPU_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

HUGE = 2 << 20  # bytes of a transparent huge page on x86-64 and arm64 (4 KB base pages)
MIN_BYTES = 2 * HUGE  # smaller buffers gain too little to pad for
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def mode() -> str:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``), or why none."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    try:
        text = _THP.read_text()
    except OSError:
        return "not available"
    return next((w[1:-1] for w in text.split() if w.startswith("[")), text.strip())


def enabled() -> bool:
    """Whether buffers are advised: Linux with THP in ``madvise`` or ``always`` mode, and not
    turned off by ``INFER_CPU_HUGE_PAGES=0``."""
    return os.environ.get("INFER_CPU_HUGE_PAGES", "1") != "0" and mode() in ("madvise", "always")


def describe() -> str:
    """For ``infer doctor``: the mode, and what the plugin does with it."""
    m = mode()
    if m not in ("madvise", "always"):
        return f"{m}: the KV cache and weights stay on 4 KB pages"
    if not enabled():
        return f"{m}; off (INFER_CPU_HUGE_PAGES=0)"
    return (f"{m}: the KV cache and the native stacks' weights are advised onto 2 MB pages "
            "(INFER_CPU_HUGE_PAGES=0 turns it off)")


def empty(nbytes: int) -> tuple[torch.Tensor, int]:
    """A uint8 buffer of at least ``nbytes``: ``(buffer, offset)``, the usable bytes starting at
    ``offset``. Where huge pages are on and ``nbytes`` is worth it, a fresh anonymous mapping
    (zeros, faulted in on first touch) whose 2 MB-aligned part is advised before anything
    touches it; else ``torch.empty`` (uninitialised), offset 0."""
    import torch

    if not enabled() or nbytes < MIN_BYTES:
        return torch.empty(nbytes, dtype=torch.uint8), 0
    # private: a shared anonymous mapping is shmem, which THP's `enabled` mode does not cover;
    # the tensor holds the mapping (unmapped when the last view goes)
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(m, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE
    m.madvise(mmap.MADV_HUGEPAGE, start, (nbytes + HUGE - 1) // HUGE * HUGE)
    return raw, start


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros(shape, dtype)`` on huge pages, every page faulted in now, as torch.zeros
    does (not inside the first decode steps that write a token there)."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw, start = empty(nbytes)
    return raw[start:start + nbytes].view(dtype).view(shape).zero_()


SLAB = 16 * HUGE  # the shared buffers that small allocations are cut from
_slab: dict[str, Any] = {"raw": None, "off": 0}
_lock = threading.Lock()


def alloc(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of ``nbytes`` (64-byte aligned) on huge pages: cut from a
    shared advised slab of 32 MB (a layer's weight matrices are too small, 0.3-3.5 MB at
    SmolLM2's shapes, to be advised one by one), or an advised buffer of its own when larger. A
    slab lives while any tensor cut from it does. Plain ``torch.empty`` where huge pages are off."""
    import torch

    if not enabled():
        return torch.empty(nbytes, dtype=torch.uint8)
    if nbytes > SLAB // 4:
        raw, start = empty(nbytes)
        return raw[start:start + nbytes]
    size = (nbytes + 63) // 64 * 64
    with _lock:
        raw, off = _slab["raw"], _slab["off"]
        if raw is None or off + size > raw.numel():
            buf, start = empty(SLAB)
            raw, off = buf[start:start + SLAB], 0
        _slab["raw"], _slab["off"] = raw, off + size
    return raw[off:off + nbytes]


def rehome(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (contiguous) on huge pages (``alloc``); the caller points its users at it
    and the original can go."""
    n = t.numel() * t.element_size()
    return alloc(n).view(t.dtype).view(t.shape).copy_(t)
