"""Which ops a platform offers (from the registries) and how each is checked.

``discover(platform, host)`` lists one ``Case`` per name that the registries resolve for the
platform (``Registries.chosen``): attention backends, linear methods (per quantization), MoE
runners, layer ops, communicators and graph runners, whichever plugin registered them. The
core's own references are not checked against themselves (a platform that only inherits them has
nothing to check there); communicators always are, against the definition of each collective.
``run_case`` runs one case on the platform's device and returns the ``Outcome``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from infer.core.ops import reference
from infer.core.plugins import PluginHost, Registries, load_target
from infer.core.testing.outcome import Outcome, Tolerances

FP8_CACHES = (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2))
KINDS = ("attention", "linear", "moe", "layer_op", "communicator", "graph_runner")
_TABLES = {"attention": "attention", "linear": "linear", "moe": "moe", "layer_op": "layer_ops",
           "communicator": "communicators", "graph_runner": "graph_runners"}
_REFERENCES = {"attention": reference.ATTENTION, "linear": reference.DENSE_LINEAR,
               "moe": reference.MOE}


@dataclass(frozen=True)
class Case:
    kind: str  # one of KINDS
    key: Any  # the registry key: backend / runner name, quantization (None: unquantized), op name
    factory: Any  # the registered factory (a "module:attr" string or the object)
    plugin: str  # who registered it

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}"


@dataclass
class Target:
    """Where the cases run: the platform (None when only a device is given) and its device."""

    platform_name: str
    device: torch.device
    platform: Any = None
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    page_sizes: tuple[int, ...] = (1, 16)
    tolerances: Tolerances = field(default_factory=Tolerances)
    ranks: tuple[int, ...] = (1, 2)
    # fp8 KV caches tried besides the activation dtype; None: those the platform's matrix runs
    kv_cache_dtypes: tuple[torch.dtype, ...] | None = None

    def fp8_caches(self) -> tuple[torch.dtype, ...]:
        if self.kv_cache_dtypes is not None:
            return self.kv_cache_dtypes
        if self.platform is None:
            return ()
        return tuple(dtype for value, dtype in FP8_CACHES if self.platform.supports("--kv-cache-dtype", value))


def _is_reference(kind: str, factory: Any) -> bool:
    ref = _REFERENCES.get(kind)
    if ref is None:
        return False
    return factory == ref if isinstance(factory, str) else factory is load_target(ref)


def discover(platform: str, host: PluginHost, kinds: tuple[str, ...] = KINDS) -> list[Case]:
    cases = []
    for kind in kinds:
        table = getattr(host.registries, _TABLES[kind])
        for key in Registries.names_for(table, platform):
            c = Registries.chosen(table, key, platform)
            if c is not None and not _is_reference(kind, c.factory):
                cases.append(Case(kind, key, c.factory, c.plugin))
    return cases


def run_case(case: Case, target: Target) -> Outcome:
    """Check one case; raises ConformanceFailure (an AssertionError) on a mismatch, OpRefused
    when it refused every configuration it could be given a choice on, KitCannotBuild when the
    kit cannot build its inputs."""
    from infer.core.testing import check_attention, check_comm, check_graph, check_ops

    t, dev, tol = target, target.device, target.tolerances
    if case.kind == "communicator":  # imported in each rank's process, so pass the target as is
        host_device = dev.type == "cpu"
        count = t.platform.info.count if t.platform is not None else 0
        return check_comm.check_communicator(case.key, case.factory, dev, host_device, count,
                                             t.dtypes, tol, t.ranks)
    factory = load_target(case.factory)
    if case.kind == "attention":
        return check_attention.check_attention(case.key, factory, dev, t.dtypes, t.page_sizes, tol,
                                               kv_dtypes=t.fp8_caches())
    if case.kind == "linear":
        return check_ops.check_linear(case.key, factory, dev, t.dtypes, tol)
    if case.kind == "moe":
        return check_ops.check_moe(case.key, factory, dev, t.dtypes, tol)
    if case.kind == "layer_op":
        return check_ops.check_layer_op(case.key, factory, dev, t.dtypes, tol)
    if case.kind == "graph_runner":
        if t.platform is None:
            raise check_ops.KitCannotBuild("a graph runner needs the platform itself (an engine "
                                           "is built on it), not only a device")
        return check_graph.check_graph_runner(case.key, factory, t.platform, t.dtypes, tol)
    raise ValueError(f"unknown case kind {case.kind!r} (known: {', '.join(KINDS)})")
