"""The rocm support matrix: every flag covered, nothing claimed, vendor-only values refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from infer.core.support import PlatformMatrix, Status, load_data_file

YAML = Path(importlib.util.find_spec("infer_rocm").origin).with_name("support.yaml")


@pytest.fixture(scope="module")
def matrix() -> PlatformMatrix:
    platform, gens, entries = load_data_file(YAML)
    pm = PlatformMatrix(platform, gens)
    for e in entries:
        pm.add(e)
    return pm


def test_nothing_is_claimed(matrix):
    # infer ships no rocm kernels: no row may say supported or experimental.
    assert not [k for k, e in matrix.rows.items() if e.status.runs]
    assert all(e.reason for e in matrix.rows.values())


def test_core_flags_have_rows(matrix):
    keys = set(matrix.keys())
    assert {"--model-path", "--attention-backend", "--tensor-parallel-size", "--page-size"} <= keys
    assert len({k for k in keys if "=" not in k}) == 336


@pytest.mark.parametrize("value,needle", [("fa3", "sm90"), ("trtllm_mha", "sm100"),
                                          ("flashinfer", "CUDA"), ("ascend", "Ascend")])
def test_vendor_values_unsupported(matrix, value, needle):
    for gen in matrix.generations:
        e = matrix.lookup(gen, "--attention-backend", value)
        assert e.status is Status.UNSUPPORTED and needle in e.reason


def test_nvidia_only_flag_unsupported(matrix):
    assert matrix.lookup(matrix.generations[0], "--enable-nccl-nvls").status is Status.UNSUPPORTED


def test_rocm_own_backend_is_not_implemented(matrix):
    e = matrix.lookup("gfx942", "--attention-backend", "aiter")
    assert e.status is Status.NOT_IMPLEMENTED and "ROCm" in e.reason
