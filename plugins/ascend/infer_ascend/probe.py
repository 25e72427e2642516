"""Ascend probe: torch_npu installed, /dev/davinciN device nodes, SoC version from npu-smi.

It also checks that the CANN toolkit is present (torch_npu cannot even be imported without
it), so ``infer doctor`` says what to install. SoC versions follow torch_npu's numbering: 220-225 are the Ascend 910B family (A2),
250-255 the Ascend 910_93 family (A3). ``npu-smi info -m`` lists each chip's name, which maps
onto that numbering; reading it needs no ACL initialisation.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from infer.core.platform import DeviceInfo, ProbeResult

GENERATIONS = ("A2", "A3")

# SoC name (as npu-smi prints the chip, without the "Ascend" prefix) -> SoC version number.
SOC_VERSIONS = {
    "910B1": 220, "910B2": 221, "910B2C": 222, "910B3": 223, "910B4": 224, "910B4-1": 225,
    "910_9391": 250, "910_9381": 251, "910_9372": 252, "910_9392": 253, "910_9382": 254,
    "910_9362": 255,
}


def ascend_generation(soc_version: int) -> str | None:
    """A2 for SoC versions 220-225, A3 for 250-255, else None (no support column)."""
    if 220 <= soc_version <= 225:
        return "A2"
    if 250 <= soc_version <= 255:
        return "A3"
    return None


def soc_version_from_name(name: str) -> int | None:
    """``"Ascend910B3"`` or ``"910B3"`` -> 223; None for an unknown name."""
    key = name.strip()
    if key.lower().startswith("ascend"):
        key = key[len("ascend"):]
    return SOC_VERSIONS.get(key.upper())


def parse_npu_smi_chips(text: str) -> list[str]:
    """Chip names from ``npu-smi info -m`` output (rows: NPU ID, Chip ID, Logic ID, Chip Name)."""
    names = []
    for line in text.splitlines():
        m = re.search(r"\bAscend\s*(910\S*)", line)
        if m:
            names.append(m.group(1))
    return names


CANN_MISSING = (
    "torch_npu is installed but the CANN toolkit is not (torch_npu cannot load without it): "
    "install Ascend-cann-toolkit and the Ascend-cann-kernels package for your SoC (A2: 910b, "
    "A3: A3) from https://www.hiascend.com/cann, the version your torch_npu release names, then "
    "`source /usr/local/Ascend/ascend-toolkit/set_env.sh` (it sets ASCEND_TOOLKIT_HOME)")
CANN_DEFAULT = Path("/usr/local/Ascend/ascend-toolkit/latest")


def cann_toolkit(env: dict[str, str] | None = None, default: Path = CANN_DEFAULT) -> Path | None:
    """The CANN toolkit folder: $ASCEND_TOOLKIT_HOME or $ASCEND_HOME_PATH (set by CANN's
    set_env.sh), else the default install path; None when none of them holds a toolkit
    (a ``version.cfg`` or ``lib64``)."""
    env = os.environ if env is None else env
    for cand in (env.get("ASCEND_TOOLKIT_HOME"), env.get("ASCEND_HOME_PATH"), str(default)):
        if cand and ((Path(cand) / "lib64").is_dir() or (Path(cand) / "version.cfg").exists()):
            return Path(cand)
    return None


def device_nodes(dev: Path = Path("/dev")) -> list[Path]:
    return sorted(p for p in dev.glob("davinci*") if p.name[len("davinci"):].isdigit())


def probe_from(torch_npu_installed: bool, nodes: list[Path], chips: list[str] | None,
               chips_error: str = "", cann_home: Path | None | bool = True) -> ProbeResult:
    """Decide from the facts gathered (kept apart from I/O so tests can fake each one).
    ``cann_home``: the CANN toolkit found (a path, or True when not checked), None when missing."""
    if not torch_npu_installed:
        return ProbeResult.not_found(
            "ascend", "torch_npu is not installed (pip install 'infer-plugin-ascend[npu]')")
    if cann_home is None:
        return ProbeResult.not_found("ascend", CANN_MISSING)
    if not nodes:
        return ProbeResult.not_found("ascend", "no Ascend device nodes (/dev/davinci*) found")
    if chips is None:
        return ProbeResult.not_found("ascend", f"cannot read the SoC version: {chips_error}")
    if not chips:
        return ProbeResult.not_found("ascend", "npu-smi lists no Ascend 910 chip")
    versions = [soc_version_from_name(c) for c in chips]
    unknown = sorted({c for c in chips if soc_version_from_name(c) is None})
    if unknown:
        return ProbeResult.not_found(
            "ascend", f"unknown Ascend SoC {', '.join(unknown)} (infer knows A2: 910B1-B4, "
                      f"A3: 910_93xx)")
    gens = sorted({ascend_generation(v) for v in versions if v is not None} - {None})
    if len(gens) != 1:
        return ProbeResult.not_found(
            "ascend", f"SoC versions {sorted(set(versions))} map to no single generation "
                      f"(A2: 220-225, A3: 250-255)")
    gen = gens[0]
    info = DeviceInfo(kind="ascend", generation=gen, name=f"Ascend{chips[0]}",
                      memory_bytes=0, count=len(chips),
                      details={"soc_version": versions[0],
                               "memory": "not queried by the probe (needs an ACL context)"})
    return ProbeResult(platform="ascend", found=True, device=info)


def _npu_smi_chips() -> tuple[list[str] | None, str]:
    exe = shutil.which("npu-smi")
    if exe is None:
        return None, "npu-smi is not on PATH (install the Ascend driver package)"
    try:
        out = subprocess.run([exe, "info", "-m"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"npu-smi info -m failed: {exc}"
    if out.returncode != 0:
        return None, f"npu-smi info -m exited {out.returncode}: {out.stderr.strip()[:200]}"
    return parse_npu_smi_chips(out.stdout), ""


def probe() -> ProbeResult:
    installed = importlib.util.find_spec("torch_npu") is not None
    cann = cann_toolkit() if installed else None
    nodes = device_nodes() if installed and cann else []
    chips, err = _npu_smi_chips() if nodes else (None, "")
    return probe_from(installed, nodes, chips, err, cann)
