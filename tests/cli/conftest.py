"""Settings tests run with no INFER_* variables from the caller's environment."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_infer_env(monkeypatch):
    for key in list(os.environ):
        if key.upper().startswith("INFER_"):
            monkeypatch.delenv(key)
