"""ROCm probe: arch mapping, torch build detection and the KFD topology reader, on fakes."""

from __future__ import annotations

from pathlib import Path

import pytest
from infer_rocm import probe as rp


@pytest.mark.parametrize("arch,gen", [
    ("gfx942", "gfx942"), ("gfx942:sramecc+:xnack-", "gfx942"), ("gfx950", "gfx950"),
    (90402, "gfx942"), ("90500", "gfx950"), ("gfx90a", None), (90010, None), ("gfx1100", None),
])
def test_generation_mapping(arch, gen):
    assert rp.rocm_generation(arch) == gen


def test_arch_name_from_target_version():
    assert rp.gfx_arch_name(90010) == "gfx90a"
    assert rp.gfx_arch_name(110000) == "gfx1100"


def _version_file(tmp_path: Path, hip: str) -> Path:
    f = tmp_path / "version.py"
    f.write_text(f"from typing import Optional\n__version__ = '2.5.0'\ncuda: Optional[str] = None\n"
                 f"hip: Optional[str] = {hip}\n")
    return f


def test_torch_hip_version_reads_file(tmp_path):
    assert rp.torch_hip_version(_version_file(tmp_path, "'6.2.41133-dd7f95766'")) == "6.2.41133-dd7f95766"
    assert rp.torch_hip_version(_version_file(tmp_path, "None")) is None
    assert rp.torch_hip_version(tmp_path / "missing.py") is None


def _node(root: Path, idx: int, version: int, mem: int) -> None:
    node = root / str(idx)
    (node / "mem_banks" / "0").mkdir(parents=True)
    (node / "properties").write_text(f"cpu_cores_count 0\nsimd_count 1216\n"
                                     f"gfx_target_version {version}\n")
    (node / "mem_banks" / "0" / "properties").write_text(f"heap_type 1\nsize_in_bytes {mem}\n")


def test_kfd_topology_reader_skips_cpu_nodes(tmp_path):
    _node(tmp_path, 0, 0, 1 << 30)  # the CPU node
    _node(tmp_path, 1, 90402, 192 << 30)
    _node(tmp_path, 2, 90402, 192 << 30)
    assert rp.kfd_gpus(tmp_path) == [(90402, 192 << 30), (90402, 192 << 30)]
    assert rp.kfd_gpus(tmp_path / "absent") == []


def test_probe_found():
    r = rp.probe_from("6.2", [(90402, 192 << 30)] * 8)
    assert r.found and r.device is not None
    assert (r.device.generation, r.device.count, r.device.memory_bytes) == ("gfx942", 8, 192 << 30)


@pytest.mark.parametrize("hip,gpus,needle", [
    (None, [(90402, 1)], "not a ROCm build"),
    ("6.2", [], "no AMD GPU"),
    ("6.2", [(90010, 1)], "gfx90a"),
    ("6.2", [(90402, 1), (90500, 1)], "mixed"),
])
def test_probe_not_found_says_why(hip, gpus, needle):
    r = rp.probe_from(hip, gpus)
    assert not r.found and needle in r.reason


def test_probe_on_this_machine_is_not_found_with_reason():
    # This CI machine runs a CPU/CUDA build of torch: the real probe must say why, not raise.
    r = rp.probe()
    if r.found:
        pytest.skip("a ROCm GPU is present")
    assert r.reason


def test_platform_object():
    r = rp.probe_from("6.2", [(90500, 288 << 30)])
    p = rp.create_platform(r)
    assert (p.name, p.generation, p.torch_device) == ("rocm", "gfx950", "cuda")
