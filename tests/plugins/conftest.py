"""Helpers to install a plugin the way pip would: a dist-info with an entry point on sys.path."""

from __future__ import annotations

from pathlib import Path

import pytest

SAMPLE_PLUGIN = Path(__file__).with_name("sample_plugin")


def write_dist(root: Path, dist: str, entry_points: dict[str, str], group: str) -> None:
    """A minimal installed distribution: ``<dist>-0.1.dist-info`` with METADATA and entry points."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"[{group}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site directory on sys.path, holding the sample third-party plugin's source."""
    monkeypatch.syspath_prepend(str(SAMPLE_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path
