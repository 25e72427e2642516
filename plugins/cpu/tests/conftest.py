"""Shared fixtures for the CPU plugin's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["native", "torch"])
def kernel_mode(request, monkeypatch) -> str:
    """Run a test with the native kernels (skipped when they cannot be built here) and without."""
    from infer_cpu import kernels

    if request.param == "native":
        if kernels.load() is None:
            pytest.skip(f"native kernels unavailable: {kernels.status().detail}")
    else:
        monkeypatch.setattr(kernels, "_state", {"lib": None, "detail": "off for this test"})
    return request.param
