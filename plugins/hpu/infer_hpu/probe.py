"""Gaudi probe: habana_frameworks installed, device types from the habanalabs driver in sysfs.

The driver exposes ``device_type`` (``GAUDI2``, ``GAUDI2B``, ``GAUDI3``, ...) for each
accelerator under ``/sys/class/accel/accel*/device/`` (older drivers:
``/sys/class/habanalabs/hl*/``). Reading it does not acquire the device.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from infer.core.platform import DeviceInfo, Platform, ProbeResult

GENERATIONS = ("gaudi2", "gaudi3")
HBM_BYTES = {"gaudi2": 96 << 30, "gaudi3": 128 << 30}  # per device, from the product specs
SYSFS_GLOBS = ("/sys/class/accel/accel*/device/device_type", "/sys/class/habanalabs/hl*/device_type")


def gaudi_generation(device_type: str) -> str | None:
    """``"GAUDI2"``, ``"GAUDI2B"``, ``"HL-225"`` -> gaudi2; ``"GAUDI3"``, ``"HL-325L"`` -> gaudi3."""
    t = device_type.strip().upper().replace(" ", "")
    if t.startswith("GAUDI3") or t.startswith("HL-3"):
        return "gaudi3"
    if t.startswith("GAUDI2") or t.startswith("HL-2"):
        return "gaudi2"
    return None


def device_types(globs: tuple[str, ...] = SYSFS_GLOBS) -> list[str]:
    types = []
    for pattern in globs:
        root = Path("/")
        for path in sorted(root.glob(pattern.lstrip("/"))):
            try:
                types.append(path.read_text().strip())
            except OSError:
                continue
        if types:
            break
    return types


def probe_from(habana_installed: bool, types: list[str]) -> ProbeResult:
    """Decide from the facts gathered (kept apart from I/O so tests can fake them)."""
    if not habana_installed:
        return ProbeResult.not_found(
            "hpu", "habana_frameworks is not installed (it ships with the Intel Gaudi software "
                   "stack, not PyPI)")
    if not types:
        return ProbeResult.not_found("hpu", "no Gaudi device found by the habanalabs driver "
                                            "(/sys/class/accel/*/device/device_type)")
    gens = {gaudi_generation(t) for t in types}
    if None in gens:
        unknown = sorted({t for t in types if gaudi_generation(t) is None})
        return ProbeResult.not_found("hpu", f"unsupported Gaudi device type {', '.join(unknown)} "
                                            f"(infer knows gaudi2, gaudi3)")
    if len(gens) > 1:
        return ProbeResult.not_found("hpu", f"mixed Gaudi generations ({', '.join(sorted(gens))}); "
                                            f"expose one kind with HABANA_VISIBLE_DEVICES")
    gen = gens.pop()
    assert gen is not None
    info = DeviceInfo(kind="hpu", generation=gen, name=types[0], memory_bytes=HBM_BYTES[gen],
                      count=len(types))
    return ProbeResult(platform="hpu", found=True, device=info)


def probe() -> ProbeResult:
    installed = importlib.util.find_spec("habana_frameworks") is not None
    return probe_from(installed, device_types() if installed else [])


class HpuPlatform(Platform):
    name = "hpu"
    torch_device = "hpu"
    dist_backend = "hccl"  # Habana's collective library, registered under this name
    default_graph_runner = "hpu_graph"


def create_platform(result: ProbeResult) -> Platform:
    assert result.device is not None
    return HpuPlatform(result.device)
