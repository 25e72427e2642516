"""The CPU plugin's support data: vendor-only values are unsupported, its own rows win."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from infer.core.plugins import PluginHost
from infer.core.support import Status

ROOT = Path(__file__).resolve().parents[3]
TSV = ROOT.parent / "shared" / "flags" / "server-flags.tsv"
VENDOR_YAML = Path(importlib.util.find_spec("infer_cpu").origin).with_name("support_vendor.yaml")


@pytest.fixture(scope="module")
def matrix():
    import infer_cpu

    host = PluginHost()
    host.add_module(infer_cpu)
    return host.matrix


def test_values_for_other_hardware_are_unsupported_with_the_reason(matrix):
    fa3 = matrix.lookup("cpu", "avx2", "--attention-backend", "fa3")
    assert fa3.status is Status.UNSUPPORTED and "sm90" in fa3.reason
    aiter = matrix.lookup("cpu", "avx512", "--attention-backend", "aiter")
    assert aiter.status is Status.UNSUPPORTED and "ROCm" in aiter.reason
    graphs = matrix.lookup("cpu", "avx2", "--cuda-graph-max-bs")
    assert graphs.status is Status.UNSUPPORTED


def test_intel_amx_depends_on_the_isa(matrix):
    assert matrix.lookup("cpu", "avx2", "--attention-backend", "intel_amx").status \
        is Status.UNSUPPORTED
    # AMX hardware could run it; infer does not implement that backend
    assert matrix.lookup("cpu", "amx", "--attention-backend", "intel_amx").status \
        is Status.NOT_IMPLEMENTED


def test_hand_kept_rows_win_over_generated_ones(matrix):
    assert matrix.lookup("cpu", "avx2", "--attention-backend", "torch_native").status \
        is Status.SUPPORTED
    assert matrix.lookup("cpu", "avx2", "--disable-cuda-graph").status is Status.SUPPORTED


def test_vendor_yaml_is_what_the_generator_writes():
    script = ROOT / "docs/tools/gen_plugin_matrix.py"
    if not script.exists() or not TSV.exists():
        pytest.skip("generator or ../shared not beside this tree")
    spec = importlib.util.spec_from_file_location("gen", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render_cpu_vendor(gen.cpu_vendor_rows(gen.read_flags(TSV)))
    assert text == VENDOR_YAML.read_text(), \
        "support_vendor.yaml is stale: run python docs/tools/gen_plugin_matrix.py"
