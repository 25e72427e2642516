"""The Ascend A2/A3 columns agree with the Ascend support page for every flag it lists, and the
rows this plugin (and the core) implement read experimental, never supported.

The page's verdicts are taken from ../shared/flags/server-flags.tsv (columns ascend_a2 and
ascend_a3) and, for option values, from the page itself. The matrix tested is the composed one
the plugin registers (infer_ascend.support.entries): the generated page rows, the core's rows,
then support_impl.yaml.
"""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import pytest
from infer.core.support import PlatformMatrix, Status

ROOT = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("INFER_SHARED_DIR", ROOT.parent / "shared"))
TSV = SHARED / "flags" / "server-flags.tsv"
PAGE = SHARED / "seeds" / "sglang-ascend-npu-support-matrix.md"
YAML = Path(importlib.util.find_spec("infer_ascend").origin).with_name("support.yaml")

pytestmark = pytest.mark.skipif(not TSV.exists(), reason=f"{TSV} not present")


@pytest.fixture(scope="module")
def matrix() -> PlatformMatrix:
    from infer_ascend.support import entries

    gens, rows = entries()
    assert gens == ["A2", "A3"]
    pm = PlatformMatrix("ascend", gens)
    for e in rows:
        pm.add(e)
    return pm


def test_the_plugin_host_serves_the_composed_matrix(matrix):
    from infer.core.plugins import get_plugin_host

    served = get_plugin_host().matrix.platforms["ascend"]
    for gen in ("A2", "A3"):
        assert [(e.key, e.status) for e in served.column(gen)] == \
            [(e.key, e.status) for e in matrix.column(gen)]


@pytest.fixture(scope="module")
def flags() -> list[dict[str, str]]:
    with TSV.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_every_flag_has_an_explicit_row(matrix, flags):
    keys = set(matrix.keys())
    missing = [r["flag"] for r in flags if r["flag"] not in keys]
    assert not missing and len(flags) == 336


@pytest.mark.parametrize("gen,column", [("A2", "ascend_a2"), ("A3", "ascend_a3")])
def test_flag_verdicts_match_the_page(matrix, flags, gen, column):
    listed = 0
    for rec in flags:
        verdict = rec[column]
        entry = matrix.lookup(gen, rec["flag"])
        if verdict == "no":
            listed += 1
            assert entry.status is Status.UNSUPPORTED, rec["flag"]
            assert f"not supported on {gen}" in entry.reason.replace("A2/A3", gen)
        elif verdict == "yes":
            listed += 1
            # nothing has run on an NPU here: experimental at most
            assert entry.status in (Status.NOT_IMPLEMENTED, Status.EXPERIMENTAL), rec["flag"]
        else:
            assert entry.status is not Status.SUPPORTED, rec["flag"]
    assert listed == 252


@pytest.mark.parametrize("gen,column", [("A2", "ascend_a2"), ("A3", "ascend_a3")])
def test_value_rows_never_contradict_the_page(matrix, flags, gen, column):
    for rec in flags:
        if rec[column] != "no":
            continue
        for key in matrix.keys():
            if key.startswith(rec["flag"] + "="):
                value = key.split("=", 1)[1]
                assert matrix.lookup(gen, rec["flag"], value).status is Status.UNSUPPORTED, key


def test_page_listed_options_are_keyed_by_value(matrix):
    # The page lists `ascend` as the attention backend, and pytorch/ascend as samplers.
    for flag, value, status in [("--attention-backend", "ascend", Status.EXPERIMENTAL),
                                ("--sampling-backend", "pytorch", Status.EXPERIMENTAL),
                                ("--sampling-backend", "ascend", Status.NOT_IMPLEMENTED),
                                ("--dtype", "bfloat16", Status.EXPERIMENTAL)]:
        e = matrix.lookup("A2", flag, value)
        assert e.value == value and e.status is status, (flag, value)
    # A3-only on the page: moe-runner-backend auto, CUDA-graph sizes.
    for flag, value in [("--moe-runner-backend", "auto"), ("--cuda-graph-max-bs", None),
                        ("--expert-parallel-size", None)]:
        assert matrix.lookup("A2", flag, value).status is Status.UNSUPPORTED
        assert matrix.lookup("A3", flag, value).status is Status.EXPERIMENTAL
    # Values that need CUDA hardware are unsupported, with the reason.
    fa3 = matrix.lookup("A3", "--attention-backend", "fa3")
    assert fa3.status is Status.UNSUPPORTED and "sm90" in fa3.reason


def test_yaml_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("gen", ROOT / "docs/tools/gen_plugin_matrix.py")
    if spec is None or not (ROOT / "docs/tools/gen_plugin_matrix.py").exists():
        pytest.skip("generator not in this tree")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rows = gen.ascend_rows(gen.read_flags(TSV), gen.read_page(PAGE))
    assert gen.render("ascend", rows) == YAML.read_text(), \
        "support.yaml is stale: run python docs/tools/gen_plugin_matrix.py"


EMULATED = "verified against an emulation of the op semantics, not yet on Ascend hardware"


@pytest.mark.parametrize("gen", ["A2", "A3"])
def test_sixty_experimental_rows_none_supported(matrix, gen):
    col = matrix.column(gen)
    experimental = [e for e in col if e.status is Status.EXPERIMENTAL]
    assert len(experimental) >= 60, len(experimental)
    assert not [e.key for e in col if e.status is Status.SUPPORTED]
    assert all(EMULATED in e.reason for e in experimental), \
        [e.key for e in experimental if EMULATED not in e.reason]


def test_core_rows_count_on_ascend(matrix):
    # core features (scheduler, server) run on Ascend: experimental, where the page allows them
    for flag, value in [("--chunked-prefill-size", None), ("--schedule-policy", "lpm"),
                        ("--api-key", None), ("--enable-mixed-chunk", None)]:
        e = matrix.lookup("A2", flag, value)
        assert e.status is Status.EXPERIMENTAL and "core" in e.reason, (flag, e)
    # ... and a core row never lifts the page's verdict (--revision is x on both)
    assert matrix.lookup("A2", "--revision").status is Status.UNSUPPORTED


def test_what_is_not_implemented_says_so(matrix):
    for gen in ("A2", "A3"):  # modelslim checkpoints load (tests/test_modelslim.py)
        e = matrix.lookup(gen, "--quantization", "modelslim")
        assert e.status is Status.EXPERIMENTAL and "emulation" in e.reason
    assert matrix.lookup("A2", "--dtype", "float32").status is Status.NOT_IMPLEMENTED
    assert matrix.lookup("A2", "--quantization", "w8a8_int8").status is Status.EXPERIMENTAL
    assert matrix.lookup("A2", "--tensor-parallel-size").status is Status.EXPERIMENTAL
