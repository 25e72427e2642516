"""infer-plugin-hpu: Intel Gaudi accelerators (gaudi2, gaudi3).

The entry-point module imports nothing heavy. The probe checks that habana_frameworks is
installed (without importing it) and reads each accelerator's type from the habanalabs
driver's sysfs attributes, so no device is acquired. habana_frameworks is not on PyPI: it comes
with the Intel Gaudi software stack. infer has no Gaudi kernels yet; the matrix says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_hpu.probe import create_platform, probe

    register("hpu", probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    register(Path(__file__).with_name("support.yaml"))
