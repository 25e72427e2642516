"""Ascend probe: SoC version mapping, npu-smi parsing and the decision, on fakes."""

from __future__ import annotations

from pathlib import Path

import pytest
from infer_ascend import probe as ap


@pytest.mark.parametrize("soc,gen", [
    (220, "A2"), (223, "A2"), (225, "A2"), (250, "A3"), (255, "A3"),
    (219, None), (226, None), (104, None), (249, None), (256, None), (260, None),
])
def test_generation_mapping(soc, gen):
    assert ap.ascend_generation(soc) == gen


@pytest.mark.parametrize("name,version", [
    ("Ascend910B1", 220), ("910B3", 223), ("ascend910b4", 224), ("910_9391", 250),
    ("Ascend910_9362", 255), ("310P3", None), ("Ascend910A", None),
])
def test_soc_name_to_version(name, version):
    assert ap.soc_version_from_name(name) == version


NPU_SMI = """\
        NPU ID                         Chip ID                        Chip Logic ID                  Chip Name
        0                              0                              0                              Ascend 910B3
        0                              1                              -                              Mcu
        1                              0                              1                              Ascend 910B3
"""


def test_parse_npu_smi():
    assert ap.parse_npu_smi_chips(NPU_SMI) == ["910B3", "910B3"]


def test_device_nodes(tmp_path: Path):
    for name in ("davinci0", "davinci1", "davinci_manager", "davinci_manager_docker"):
        (tmp_path / name).touch()
    assert [p.name for p in ap.device_nodes(tmp_path)] == ["davinci0", "davinci1"]


def test_probe_found_a2():
    r = ap.probe_from(True, [Path("/dev/davinci0")] * 2, ["910B3", "910B3"])
    assert r.found and r.device is not None
    assert (r.device.generation, r.device.count) == ("A2", 2)
    assert r.device.details["soc_version"] == 223


def test_probe_found_a3():
    r = ap.probe_from(True, [Path("/dev/davinci0")], ["910_9391"])
    assert r.found and r.device.generation == "A3"


@pytest.mark.parametrize("installed,nodes,chips,err,needle", [
    (False, [], None, "", "torch_npu is not installed"),
    (True, [], None, "", "/dev/davinci"),
    (True, [Path("/dev/davinci0")], None, "npu-smi is not on PATH", "npu-smi is not on PATH"),
    (True, [Path("/dev/davinci0")], [], "", "no Ascend 910"),
    (True, [Path("/dev/davinci0")], ["910A"], "", "unknown Ascend SoC 910A"),
    (True, [Path("/dev/davinci0")], ["910B1", "910_9391"], "", "no single generation"),
])
def test_probe_not_found_says_why(installed, nodes, chips, err, needle):
    r = ap.probe_from(installed, nodes, chips, err)
    assert not r.found and needle in r.reason


def test_probe_on_this_machine():
    r = ap.probe()
    if r.found:
        pytest.skip("an Ascend NPU is present")
    assert r.reason


def test_platform_object():
    p = ap.create_platform(ap.probe_from(True, [Path("/dev/davinci0")], ["910B2"]))
    assert (p.name, p.generation, p.torch_device, p.dist_backend) == ("ascend", "A2", "npu", "hccl")
