"""Fixtures of the Ascend plugin's tests.

Without an NPU the tests run through the torch_npu emulation in npu_emulation/ (plain torch,
from each op's documentation). With INFER_ASCEND_HARDWARE=1 (``nox -s ascend`` on an Ascend
machine) the same tests run on the real torch_npu and the NPU instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

EMULATION = Path(__file__).resolve().parent / "npu_emulation"
HARDWARE = os.environ.get("INFER_ASCEND_HARDWARE") == "1"


@pytest.fixture(scope="module")
def npu_emulation():
    """The emulation switched on for one test module (None on real hardware); switched off
    after it, so that no other test of the session sees a torch_npu."""
    if HARDWARE:
        yield None
        return
    sys.path.insert(0, str(EMULATION))
    import ascend_emulation

    ascend_emulation.install("A2")
    yield ascend_emulation
    ascend_emulation.uninstall()
    sys.modules.pop("ascend_emulation", None)


@pytest.fixture(scope="module")
def ascend(npu_emulation):
    """The active Ascend platform: an emulated A2 chip, or the real NPU."""
    if npu_emulation is None:
        from infer.core.plugins import get_plugin_host

        return get_plugin_host().select("ascend")
    return npu_emulation.emulated_platform("A2")


@pytest.fixture(scope="module")
def device(ascend):
    import torch

    return torch.device(ascend.torch_device)
