"""ROCm probe: a ROCm build of torch (``torch.version.hip``) plus AMD GPUs in the KFD topology.

Nothing here imports torch or opens a device: torch's build is read from its ``version.py``
file and the GPUs from ``/sys/class/kfd/kfd/topology/nodes/*/properties``, where each GPU node
carries ``gfx_target_version`` (major * 10000 + minor * 100 + stepping, 90402 for gfx942).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path

from infer.core.platform import DeviceInfo, Platform, ProbeResult

GENERATIONS = ("gfx942", "gfx950")
MARKETING = {"gfx942": "AMD Instinct MI300X/MI325X (gfx942)",
             "gfx950": "AMD Instinct MI350X/MI355X (gfx950)"}
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


def torch_hip_version(version_file: Path | None = None) -> str | None:
    """The ``hip`` field of torch's version.py (None for CUDA/CPU builds or no torch)."""
    if version_file is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        version_file = Path(spec.origin).with_name("version.py")
    try:
        text = version_file.read_text()
    except OSError:
        return None
    m = re.search(r"^hip\s*(?::[^=]+)?=\s*(.+)$", text, re.MULTILINE)
    if m is None:
        return None
    try:
        value = ast.literal_eval(m.group(1).strip())
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) and value else None


def gfx_arch_name(arch: str | int) -> str:
    """Normalise an arch to ``gfxNNN``: ``"gfx942:sramecc+:xnack-"`` or 90402 -> ``"gfx942"``."""
    if isinstance(arch, int) or str(arch).isdigit():
        v = int(arch)
        major, minor, step = v // 10000, (v // 100) % 100, v % 100
        return f"gfx{major}{minor:x}{step:x}"
    return str(arch).split(":", 1)[0].strip().lower()


def rocm_generation(arch: str | int) -> str | None:
    """The support-matrix column for an arch, or None when infer has no column for it."""
    name = gfx_arch_name(arch)
    return name if name in GENERATIONS else None


def _read_properties(path: Path) -> dict[str, int]:
    props = {}
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                props[parts[0]] = int(parts[1])
    except OSError:
        pass
    return props


def kfd_gpus(nodes_dir: Path = KFD_NODES) -> list[tuple[int, int]]:
    """(gfx_target_version, memory bytes) for each GPU node; CPU nodes have version 0."""
    gpus = []
    if not nodes_dir.is_dir():
        return gpus
    for node in sorted(nodes_dir.iterdir()):
        props = _read_properties(node / "properties")
        version = props.get("gfx_target_version", 0)
        if version <= 0:
            continue
        mem = sum(_read_properties(bank / "properties").get("size_in_bytes", 0)
                  for bank in sorted((node / "mem_banks").glob("*")))
        gpus.append((version, mem))
    return gpus


def probe_from(hip: str | None, gpus: Iterable[tuple[int, int]]) -> ProbeResult:
    """Decide from the torch build and the GPU list (separate from I/O so tests can fake both)."""
    if hip is None:
        return ProbeResult.not_found(
            "rocm", "torch is not a ROCm build (torch.version.hip is unset); install torch from "
                    "the ROCm wheel index")
    gpus = list(gpus)
    if not gpus:
        return ProbeResult.not_found("rocm", f"torch is a ROCm build (HIP {hip}) but no AMD GPU "
                                             f"is listed in {KFD_NODES}")
    archs = sorted({gfx_arch_name(v) for v, _ in gpus})
    if len(archs) > 1:
        return ProbeResult.not_found(
            "rocm", f"mixed GPU architectures ({', '.join(archs)}); expose one kind with "
                    f"HIP_VISIBLE_DEVICES")
    gen = rocm_generation(archs[0])
    if gen is None:
        return ProbeResult.not_found(
            "rocm", f"found {archs[0]}, which infer has no support data for (known: "
                    f"{', '.join(GENERATIONS)})")
    info = DeviceInfo(kind="rocm", generation=gen, name=MARKETING[gen],
                      memory_bytes=min(m for _, m in gpus), count=len(gpus),
                      details={"hip": hip})
    return ProbeResult(platform="rocm", found=True, device=info)


def probe() -> ProbeResult:
    if importlib.util.find_spec("torch") is None:
        return ProbeResult.not_found("rocm", "torch is not installed (install the ROCm build of "
                                             "torch from the ROCm wheel index)")
    return probe_from(torch_hip_version(), kfd_gpus())


class RocmPlatform(Platform):
    name = "rocm"
    torch_device = "cuda"  # ROCm builds of torch expose HIP devices under the cuda type
    dist_backend = "nccl"  # RCCL, under torch's nccl name
    default_attention_backend = "aiter"


def create_platform(result: ProbeResult) -> Platform:
    assert result.device is not None
    return RocmPlatform(result.device)
