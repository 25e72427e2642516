"""Gaudi probe: device-type mapping, the sysfs reader and the decision, on fakes."""

from __future__ import annotations

import pytest
from infer_hpu import probe as hp


@pytest.mark.parametrize("dtype,gen", [
    ("GAUDI2", "gaudi2"), ("GAUDI2B", "gaudi2"), ("GAUDI2C", "gaudi2"), ("gaudi3", "gaudi3"),
    ("HL-225", "gaudi2"), ("HL-325L", "gaudi3"), ("GAUDI", None), ("GAUDI SEC", None),
    ("GOYA", None),
])
def test_generation_mapping(dtype, gen):
    assert hp.gaudi_generation(dtype) == gen


def test_sysfs_reader(tmp_path):
    for i, t in enumerate(["GAUDI3", "GAUDI3"]):
        d = tmp_path / "sys" / "class" / "accel" / f"accel{i}" / "device"
        d.mkdir(parents=True)
        (d / "device_type").write_text(t + "\n")
    pattern = str(tmp_path / "sys/class/accel/accel*/device/device_type")
    assert hp.device_types((pattern,)) == ["GAUDI3", "GAUDI3"]
    assert hp.device_types((str(tmp_path / "none/*/device_type"),)) == []


def test_probe_found():
    r = hp.probe_from(True, ["GAUDI2"] * 8)
    assert r.found and r.device is not None
    assert (r.device.generation, r.device.count, r.device.memory_bytes) == ("gaudi2", 8, 96 << 30)


@pytest.mark.parametrize("installed,types,needle", [
    (False, [], "habana_frameworks is not installed"),
    (True, [], "no Gaudi device"),
    (True, ["GAUDI"], "unsupported Gaudi device type GAUDI"),
    (True, ["GAUDI2", "GAUDI3"], "mixed"),
])
def test_probe_not_found_says_why(installed, types, needle):
    r = hp.probe_from(installed, types)
    assert not r.found and needle in r.reason


def test_probe_on_this_machine():
    r = hp.probe()
    if r.found:
        pytest.skip("a Gaudi device is present")
    assert r.reason


def test_platform_object():
    p = hp.create_platform(hp.probe_from(True, ["GAUDI3"]))
    assert (p.name, p.generation, p.torch_device) == ("hpu", "gaudi3", "hpu")
