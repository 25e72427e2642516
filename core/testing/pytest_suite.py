"""The kit as pytest tests: ``conformance_test(platform)`` returns a test function parametrized
over every case ``discover`` finds for the platform; assign it to a ``test_*`` name in a test
module. Collection only reads the registries; the platform is selected (its probe run, its device
chosen) when the first case runs, and a platform this machine does not have skips every case
with the probe's reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from infer.core.plugins import PlatformSelectionError, PluginHost, get_plugin_host
from infer.core.testing.check_ops import KitCannotBuild
from infer.core.testing.conformance import KINDS, Case, Target, discover, run_case
from infer.core.testing.outcome import OpRefused, Tolerances


def default_platform(host: PluginHost) -> str:
    """``INFER_DEVICE``, else the platform selection would pick (``PluginHost.select``)."""
    name = os.environ.get("INFER_DEVICE")
    if name and name != "auto":
        return name
    return host.select(None).name


def conformance_test(platform: str | None = None, *, host: PluginHost | None = None,
                     device: str | None = None, kinds: tuple[str, ...] = KINDS,
                     dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
                     page_sizes: tuple[int, ...] = (1, 16), tolerances: Tolerances | None = None,
                     ranks: tuple[int, ...] = (1, 2),
                     kv_cache_dtypes: tuple[torch.dtype, ...] | None = None,
                     marks: tuple[Any, ...] = ()) -> Callable[..., None]:
    """A pytest test over ``platform``'s registered ops (default: ``default_platform``).

    ``host``: the plugin host (default: the process-wide one, from entry points). ``device``: run
    on this torch device without selecting the platform (e.g. the CUDA plugin's Triton kernels on
    the CPU under ``TRITON_INTERPRET=1``); graph runners then cannot be checked.
    ``kv_cache_dtypes``: fp8 caches attention is also checked with (default: those the platform's
    matrix runs; none with ``device``). ``marks``: pytest marks for every case (``pytest.mark.gpu``).
    """
    host = host or get_plugin_host()
    name = platform or default_platform(host)
    if name not in host.registries.platforms and device is None:
        known = ", ".join(sorted(host.registries.platforms)) or "none"
        raise PlatformSelectionError(f"conformance kit: no installed plugin provides platform "
                                     f"{name!r} (installed: {known})")
    cases = discover(name, host, kinds)
    state: dict[str, Any] = {}

    def target() -> Target:
        if "target" not in state:
            if device is not None:
                state["target"] = Target(name, torch.device(device))
            else:
                try:
                    chosen = host.select(name)
                except PlatformSelectionError as e:
                    state["skip"] = str(e)
                    chosen = None
                if chosen is not None:
                    state["target"] = Target(name, torch.device(chosen.torch_device), chosen)
            if "target" in state:
                t = state["target"]
                t.dtypes, t.page_sizes, t.ranks = dtypes, page_sizes, ranks
                t.kv_cache_dtypes = kv_cache_dtypes
                t.tolerances = tolerances or Tolerances()
        if "skip" in state:
            pytest.skip(f"platform {name!r} is not available here: {state['skip']}")
        return state["target"]

    params = [pytest.param(c, id=str(c), marks=list(marks)) for c in cases]

    @pytest.mark.parametrize("case", params)
    def test_conformance(case: Case) -> None:
        try:
            outcome = run_case(case, target())
        except (KitCannotBuild, OpRefused) as e:
            pytest.skip(f"{case} ({case.plugin}): {e}")
        if not outcome.matched:
            pytest.skip(outcome.summary())
        print(outcome.summary())

    test_conformance.__doc__ = f"Every op registered for platform {name!r} against the core's references."
    return test_conformance
