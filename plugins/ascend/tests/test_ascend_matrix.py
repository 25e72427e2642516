"""The Ascend A2/A3 columns agree with the Ascend support page for every flag it lists.

The page's verdicts are taken from ../shared/flags/server-flags.tsv (columns ascend_a2 and
ascend_a3) and, for option values, from the page itself.
"""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import pytest
from infer.core.support import PlatformMatrix, Status, load_data_file

ROOT = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("INFER_SHARED_DIR", ROOT.parent / "shared"))
TSV = SHARED / "flags" / "server-flags.tsv"
PAGE = SHARED / "seeds" / "sglang-ascend-npu-support-matrix.md"
YAML = Path(importlib.util.find_spec("infer_ascend").origin).with_name("support.yaml")

pytestmark = pytest.mark.skipif(not TSV.exists(), reason=f"{TSV} not present")


@pytest.fixture(scope="module")
def matrix() -> PlatformMatrix:
    platform, gens, entries = load_data_file(YAML)
    assert platform == "ascend" and gens == ["A2", "A3"]
    pm = PlatformMatrix(platform, gens)
    for e in entries:
        pm.add(e)
    return pm


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
            # No Ascend kernels exist in infer: the page's "supported" is not-implemented here.
            assert entry.status is Status.NOT_IMPLEMENTED, rec["flag"]
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
    for flag, value in [("--attention-backend", "ascend"), ("--sampling-backend", "pytorch"),
                        ("--sampling-backend", "ascend"), ("--dtype", "bfloat16")]:
        e = matrix.lookup("A2", flag, value)
        assert e.value == value and e.status is Status.NOT_IMPLEMENTED
    # A3-only on the page: moe-runner-backend auto.
    assert matrix.lookup("A2", "--moe-runner-backend", "auto").status is Status.UNSUPPORTED
    assert matrix.lookup("A3", "--moe-runner-backend", "auto").status is Status.NOT_IMPLEMENTED
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
