"""infer-plugin-cpu: the CPU platform. Its ops are the plain-torch references of every op.

This module is the entry point: it imports nothing heavy (torch is imported by the factories).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1


@hookimpl
def register_platforms(register: Any) -> None:
    from infer_cpu.probe import create_platform, probe

    register("cpu", probe, create_platform)


@hookimpl
def register_support_matrix(register: Any) -> None:
    register(Path(__file__).with_name("support.yaml"))
