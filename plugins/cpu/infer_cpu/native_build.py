"""Building the native CPU kernels (``kernels/infer_cpu_kernels.c``); no torch import, so the
device probe (``infer doctor``) can report on it cheaply.

The library is compiled for the machine that runs it (``-O3 -march=native -fopenmp``, falling
back to fewer flags) into ``$INFER_CACHE_DIR/kernels/<hash>/`` (default ``~/.cache/infer``), keyed
by the source, the compiler and flags, and the CPU (model name and feature flags).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).parent / "kernels" / "infer_cpu_kernels.c"
FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-march=native"], ["-O3"])
LIB_NAME = "libinfer_cpu_kernels.so"
# the bf16 GEMM and bf16 decode step (kernels/bf16.py), a library of its own
BF16_SOURCE = Path(__file__).parent / "kernels" / "infer_cpu_bf16.c"
BF16_LIB_NAME = "libinfer_cpu_bf16.so"
# the shared-memory all-reduce (infer_cpu.ops.shm_comm), a library of its own
COMM_SOURCE = Path(__file__).parent / "kernels" / "infer_cpu_comm.c"
COMM_LIB_NAME = "libinfer_cpu_comm.so"


def _cache_dir() -> Path:
    return Path(os.environ.get("INFER_CACHE_DIR") or Path.home() / ".cache" / "infer") / "kernels"


def _cpu_id() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines)
    except OSError:
        return platform.processor() or platform.machine()


def pool_swap_setting() -> int:
    """The native work pool's core swap (``kernels/infer_cpu_pool.h``): 1 (on) unless
    ``INFER_CPU_POOL_SWAP=0``. The libraries take it when they load."""
    return 0 if os.environ.get("INFER_CPU_POOL_SWAP", "1") == "0" else 1


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _target(cc: str, flags: list[str], source: Path = SOURCE, lib_name: str = LIB_NAME) -> Path:
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers + " ".join([cc, *flags]).encode()
                         + _cpu_id().encode()).hexdigest()[:16]
    return _cache_dir() / key / lib_name


def build(cc: str, source: Path = SOURCE, lib_name: str = LIB_NAME) -> tuple[Path, list[str]]:
    """Path of the library for this source, compiler and CPU (compiled now if not cached)."""
    errors = []
    for flags in FLAG_SETS:
        out = _target(cc, flags, source, lib_name)
        if out.exists():
            return out, flags
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            cmd = [cc, *flags, "-shared", "-fPIC", "-o", str(tmp_out), str(source), "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_out, out)  # atomic: concurrent builders agree on the result
                return out, flags
            errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
    raise RuntimeError("; ".join(errors))


def disabled() -> bool:
    """``INFER_CPU_KERNELS=0`` (or false/off) switches the native kernels off."""
    return os.environ.get("INFER_CPU_KERNELS", "1") in ("0", "false", "off")


def describe() -> str:
    """One line for ``infer doctor``: whether the native kernels are used, and why not."""
    if disabled():
        return "off (INFER_CPU_KERNELS=0): plain-torch ops"
    cc = compiler()
    if cc is None:
        return "unavailable: no C compiler (cc/gcc/clang) on PATH; plain-torch ops and torch's int4/int8 kernels"
    for flags in FLAG_SETS:
        if (path := _target(cc, flags)).exists():
            return f"built ({cc} {' '.join(flags)}): {path}"
    return f"compiled with {cc} on first use (about 2 s), then cached under {_cache_dir()}"
