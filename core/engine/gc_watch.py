"""Python's garbage collector in the server's processes.

``--gc-warning-threshold-secs S`` (SGLang's flag; 0, the default, turns it off): every process of
the server (HTTP, engine, tensor-parallel ranks) logs a warning for each collection that took
longer than S seconds, with its generation and duration. A full (generation 2) collection walks
every tracked object, and start-up leaves millions of them (torch, transformers, the model's
modules): 135-149 ms each in the default model's engine once started (370,000 objects), a pause
in every running request's stream.

``pause_for_startup`` (each server process, as it starts) turns collection off: start-up
imports and loads millions of long-lived objects and makes little garbage, and every full
collection walked all of them (a process loading the default model: 14-16 collections over 2 ms,
2.5 s in all; ``infer serve`` of the default model until /v1/models answers: 17.6-17.8 s with
them, 13.9-14.2 s without). ``freeze_startup_heap`` (each process,
once it is ready to serve) collects once, moves what start-up left into the permanent generation
(``gc.freeze``), so later collections walk only what serving allocated, and turns collection back
on. vLLM freezes its engine's heap after start-up in the same way.

The engine and its ranks read the threshold from ``EngineConfig.gc_warning_threshold_secs``; the
HTTP process from its own arguments.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("infer.gc")

_installed: dict[str, Any] = {}


def install_warning(threshold: float, who: str = "process") -> bool:
    """Log collections longer than ``threshold`` seconds (0: off) in this process, naming it
    ``who``; at most one watcher per process. Returns whether one is installed."""
    uninstall_warning()
    if threshold <= 0:
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


def pause_for_startup() -> None:
    """No collections until ``freeze_startup_heap`` (which every server process reaches once it
    is ready, or it exits)."""
    gc.disable()


def resume() -> None:
    """Collection on again (a process leaving start-up without ``freeze_startup_heap``)."""
    gc.enable()


def freeze_startup_heap() -> int:
    """Collect once, then freeze every object alive now (start-up's) and turn collection on
    (again, after ``pause_for_startup``); returns how many are frozen. Objects frozen this way
    are never collected, so it is called once start-up's garbage is gone: after the collection
    here."""
    gc.collect()
    gc.freeze()
    gc.enable()
    return gc.get_freeze_count()
