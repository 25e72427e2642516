"""The HTTP process's event loop: uvloop where it is installed, asyncio's own otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest
from infer.server import launch


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_http_process_runs_on_uvloop_when_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    assert launch.event_loop_factory() is uvloop.new_event_loop
    assert launch._run_loop(_loop_module()).startswith("uvloop")


def test_without_uvloop_asyncio_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert launch.event_loop_factory() is None
    assert launch._run_loop(_loop_module()).startswith("asyncio")
