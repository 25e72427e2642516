"""infer-plugin-rocm: AMD Instinct GPUs (gfx942: MI300X/MI325X, gfx950: MI350X/MI355X).

The entry-point module imports nothing heavy: the probe reads torch's version file and the
kernel driver's sysfs topology, so it neither imports torch nor creates a HIP context.
infer has no ROCm kernels yet; the support matrix says so flag by flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_rocm.probe import create_platform, probe

    register("rocm", probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    register(Path(__file__).with_name("support.yaml"))
