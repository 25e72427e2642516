"""``--gc-warning-threshold-secs`` and the start-up heap freeze (``infer.core.engine.gc_watch``)."""

from __future__ import annotations

import gc
import logging

import pytest
from infer.core.engine import gc_watch


@pytest.fixture(autouse=True)
def _restore():
    yield
    gc_watch.uninstall_warning()
    gc.unfreeze()


def _long_collection_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "long garbage collection" in r.getMessage()]


def test_a_collection_over_the_threshold_is_logged_with_its_generation(caplog):
    assert gc_watch.install_warning(1e-9, "engine")
    with caplog.at_level(logging.WARNING, logger="infer.gc"):
        gc.collect()  # a full collection: generation 2
    records = _long_collection_records(caplog)
    assert records and "engine process: generation 2 took" in records[-1].getMessage()


def test_a_collection_under_the_threshold_is_not_logged(caplog):
    assert gc_watch.install_warning(3600.0, "engine")
    with caplog.at_level(logging.WARNING, logger="infer.gc"):
        gc.collect()
    assert not _long_collection_records(caplog)


def test_zero_turns_it_off_and_uninstall_removes_the_callback(caplog):
    before = len(gc.callbacks)
    assert not gc_watch.install_warning(0.0, "engine")
    assert len(gc.callbacks) == before
    assert gc_watch.install_warning(1e-9, "engine")
    assert gc_watch.install_warning(1e-9, "engine")  # again: replaces, does not add a second
    assert len(gc.callbacks) == before + 1
    gc_watch.uninstall_warning()
    assert len(gc.callbacks) == before
    with caplog.at_level(logging.WARNING, logger="infer.gc"):
        gc.collect()
    assert not _long_collection_records(caplog)


def test_the_flag_reaches_the_engine_and_rank_view():
    """The engine (EngineCore) and every rank (``multiproc._worker_main``, Ray actors included)
    install the watcher from EngineConfig, which the ranks receive whole."""
    from infer.core.config import ServerArgs
    from infer.core.config.views import EngineConfig

    cfg = EngineConfig.from_server_args(ServerArgs(model_path="m", gc_warning_threshold_secs=0.25))
    assert cfg.gc_warning_threshold_secs == 0.25
    assert EngineConfig.from_server_args(ServerArgs(model_path="m")).gc_warning_threshold_secs == 0


def test_freeze_moves_the_live_heap_out_of_the_collectors_sight():
    gc.unfreeze()
    kept = [[i] for i in range(1000)]  # alive: frozen with the rest
    frozen = gc_watch.freeze_startup_heap()
    assert frozen == gc.get_freeze_count() and frozen > len(kept)
    tracked = {id(o) for generation in (0, 1, 2) for o in gc.get_objects(generation)}
    assert not any(id(x) in tracked for x in kept)  # in the permanent generation now


def test_startup_pause_lasts_until_the_freeze():
    try:
        gc_watch.pause_for_startup()
        assert not gc.isenabled()
        gc_watch.freeze_startup_heap()
        assert gc.isenabled()
    finally:
        gc.enable()


def test_serve_that_fails_at_start_up_leaves_collection_on(monkeypatch):
    """``infer serve`` pauses collection for start-up; leaving early (here: a model path that
    does not exist, exit code 2) turns it back on."""
    from infer.cli.main import app
    from typer.testing import CliRunner

    seen: list[bool] = []
    real = gc_watch.pause_for_startup

    def pause() -> None:
        real()
        seen.append(gc.isenabled())

    monkeypatch.setattr(gc_watch, "pause_for_startup", pause)
    try:
        res = CliRunner().invoke(app, ["serve", "--model-path", "/nonexistent/model"])
        on_after = gc.isenabled()
    finally:
        gc.enable()  # whatever happened, not left off for the tests after this one
    assert res.exit_code == 2, res.output
    assert seen == [False]  # paused during start-up
    assert on_after
