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


@pytest.mark.parametrize("name,gen", [("Ascend910B3", "A2"), ("Ascend910_9391", "A3"),
                                      ("Ascend310P3", None)])
def test_generation_from_torch_npu_device_name(name, gen):
    from infer_ascend.platform import generation_from_device_name

    assert generation_from_device_name(name) == gen


def test_default_adjustments_page_size_and_backend():
    from infer.core.config import ServerArgs
    from infer.core.config.gate import apply_platform_defaults
    from infer_ascend.platform import create_platform

    p = create_platform(ap.probe_from(True, [Path("/dev/davinci0")], ["910B2"]))
    args = ServerArgs(model_path="m")
    applied = {a.name: a.value for a in apply_platform_defaults(args, p)}
    assert applied["page_size"] == 128 and args.page_size == 128
    assert applied["attention_backend"] == "ascend"
    explicit = ServerArgs(model_path="m", page_size=256)
    apply_platform_defaults(explicit, p)
    assert explicit.page_size == 256  # a user's value is kept


def test_probe_on_this_machine():
    r = ap.probe()
    if r.found:
        pytest.skip("an Ascend NPU is present")
    assert r.reason


def test_platform_object():
    from infer_ascend.platform import create_platform

    p = create_platform(ap.probe_from(True, [Path("/dev/davinci0")], ["910B2"]))
    assert (p.name, p.generation, p.dist_backend) == ("ascend", "A2", "hccl")
    assert (p.default_attention_backend, p.default_graph_runner) == ("ascend", "acl_graph")


def test_cann_missing_says_what_to_install():
    r = ap.probe_from(True, [Path("/dev/davinci0")], ["910B2"], cann_home=None)
    assert not r.found and "CANN toolkit" in r.reason and "set_env.sh" in r.reason
    assert "Ascend-cann-toolkit" in r.reason


def test_cann_toolkit_lookup(tmp_path):
    assert ap.cann_toolkit(env={}, default=tmp_path / "none") is None
    (tmp_path / "tk" / "lib64").mkdir(parents=True)
    assert ap.cann_toolkit(env={"ASCEND_TOOLKIT_HOME": str(tmp_path / "tk")},
                           default=tmp_path / "none") == tmp_path / "tk"
    assert ap.cann_toolkit(env={"ASCEND_HOME_PATH": str(tmp_path / "x")},
                           default=tmp_path / "tk") == tmp_path / "tk"


def test_probe_with_torch_npu_but_no_cann(monkeypatch):
    monkeypatch.setattr(ap.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(ap, "cann_toolkit", lambda: None)
    r = ap.probe()
    assert not r.found and "CANN toolkit" in r.reason
