"""infer-plugin-ascend: Huawei Ascend NPUs (A2: Atlas 800I/900 A2, A3: Atlas A3 SuperPoD).

The entry-point module imports nothing heavy. The probe checks that torch_npu is installed
(without importing it), that the driver's device nodes exist, and reads the SoC name from
``npu-smi``, so no ACL context is created. infer has no Ascend kernels yet: the support matrix
marks every flag that the Ascend page calls supported as not-implemented here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_ascend.probe import create_platform, probe

    register("ascend", probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    register(Path(__file__).with_name("support.yaml"))
