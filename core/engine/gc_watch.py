"""Python's garbage collector in the server's processes.

``--gc-warning-threshold-secs S`` (SGLang's flag; 0, the default, turns it off): every process of
the server (HTTP, engine, tensor-parallel ranks) logs a warning for each collection that took
longer than S seconds, with its generation and duration. A full (generation 2) collection walks
every tracked object, and start-up leaves millions of them (torch, transformers, the model's
modules): measured on the default model's engine process, 240-285 ms each, a pause in every
request's stream.

``freeze_startup_heap`` (each process, once it is ready to serve) collects once and then moves
what start-up left into the permanent generation (``gc.freeze``), so later collections walk only
what serving allocated. vLLM freezes its engine's heap after start-up in the same way.

The threshold travels to the spawned processes in the environment (``ENV``), set by the launcher
before it starts them.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any

ENV = "INFER_GC_WARNING_THRESHOLD_SECS"
log = logging.getLogger("infer.gc")

_installed: dict[str, Any] = {}


def threshold_from_args(args: Any) -> float:
    """``--gc-warning-threshold-secs`` in seconds (0: off; the flag checks refuse a negative)."""
    return float(getattr(args, "gc_warning_threshold_secs", None) or 0.0)


def export_threshold(threshold: float) -> None:
    """Hand the threshold to the processes this one spawns from now on."""
    if threshold > 0:
        os.environ[ENV] = repr(threshold)
    else:
        os.environ.pop(ENV, None)


def install_warning(threshold: float | None = None, who: str = "process") -> bool:
    """Log collections longer than ``threshold`` seconds (from ``ENV`` when None) in this
    process; at most one watcher per process. Returns whether one is installed."""
    if threshold is None:
        try:
            threshold = float(os.environ.get(ENV, "0") or 0)
        except ValueError:
            threshold = 0.0
    uninstall_warning()
    if not threshold or threshold <= 0:
        return False
    started: list[float] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
            return
        if not started:
            return
        took = time.perf_counter() - started[0]
        if took > threshold:
            log.warning("long garbage collection in the %s process: generation %d took %.3f s "
                        "(collected %d objects; --gc-warning-threshold-secs %g)", who,
                        info.get("generation", -1), took, info.get("collected", 0), threshold)

    gc.callbacks.append(watch)
    _installed["watch"] = watch
    return True


def uninstall_warning() -> None:
    watch = _installed.pop("watch", None)
    if watch is not None and watch in gc.callbacks:
        gc.callbacks.remove(watch)


def freeze_startup_heap() -> int:
    """Collect once, then freeze every object alive now (start-up's); returns how many are
    frozen. Objects frozen this way are never collected, so it is called once start-up's
    garbage is gone: after the collection here."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
