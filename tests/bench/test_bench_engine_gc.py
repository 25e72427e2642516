"""``infer bench offline`` / ``one-batch`` start their engine as the server's engine process
does: no garbage collection while it loads, start-up's heap frozen after the warm-up."""

from __future__ import annotations

import gc
import random

import pytest
from infer.cli import bench_engine


@pytest.fixture
def restore_gc():
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_the_engine_loads_without_collections_then_its_heap_is_frozen(monkeypatch, restore_gc):
    seen: dict[str, object] = {}
    kept = [object() for _ in range(1000)]  # start-up's long-lived objects

    def fake_make_core(server_args):
        seen["enabled while loading"] = gc.isenabled()
        return "core"

    def fake_warmup(core, rng):
        seen["warmed"] = core
        seen["enabled while warming up"] = gc.isenabled()

    monkeypatch.setattr(bench_engine, "make_core", fake_make_core)
    monkeypatch.setattr(bench_engine, "warmup", fake_warmup)
    gc.enable()
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert bench_engine.make_ready_core(object(), random.Random(0)) == "core"
    assert seen == {"enabled while loading": False, "warmed": "core", "enabled while warming up": False}
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)


def test_collection_comes_back_when_the_engine_fails_to_start(monkeypatch, restore_gc):
    def broken(server_args):
        raise RuntimeError("no such model")

    monkeypatch.setattr(bench_engine, "make_core", broken)
    gc.enable()
    with pytest.raises(RuntimeError, match="no such model"):
        bench_engine.make_ready_core(object(), random.Random(0))
    assert gc.isenabled()
