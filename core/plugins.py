"""The plugin manager: entry-point discovery, registries, and platform selection.

Every hook is called the one way pluggy offers, ``pm.hook.<name>(register=...)``, restricted to
one plugin at a time (``subset_hook_caller``) so that a raise is charged to the plugin that raised
and the others still load; only functions marked ``@hookimpl`` are hooks.

Nothing is swallowed: a plugin that fails to import, declares another API major version, defines
a ``register_*`` function without ``@hookimpl`` or a ``@hookimpl`` that names no hook, or whose
hook or probe raises is recorded in ``PluginHost.failures`` with the reason, for ``infer doctor``.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy
from infer.core import hookspecs
from infer.core.platform import Platform, ProbeResult
from infer.core.support import SupportMatrix, load_data_file

ENTRY_POINT_GROUP = "infer.plugins"
HOOK_NAMES: tuple[str, ...] = tuple(n for n in vars(hookspecs) if n.startswith("register_"))


class PlatformSelectionError(Exception):
    """No platform, or more than one, could be chosen; the message says what to do."""


@dataclass
class PluginRecord:
    name: str  # entry-point name
    module: str
    version: str = ""
    loaded: bool = False
    error: str = ""


@dataclass
class Contribution:
    factory: Any
    platforms: tuple[str, ...] | None  # None: every platform
    plugin: str = ""

    def runs_on(self, platform: str) -> bool:
        return self.platforms is None or platform in self.platforms


def load_target(target: Any) -> Any:
    """``target`` itself, or for a ``"module:attr"`` string the attribute, imported now. Plugins
    register such strings so that registering stays free of heavy imports (torch, kernels)."""
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)
    return target


@dataclass
class PlatformSpec:
    name: str
    probe: Callable[[], ProbeResult]
    factory: Callable[[ProbeResult], Platform]
    plugin: str


@dataclass
class Registries:
    """What the register_* hooks contributed, keyed as the flags name them."""

    platforms: dict[str, PlatformSpec] = field(default_factory=dict)
    attention: dict[str, list[Contribution]] = field(default_factory=dict)
    linear: dict[str | None, list[Contribution]] = field(default_factory=dict)
    moe: dict[str, list[Contribution]] = field(default_factory=dict)
    communicators: dict[str, list[Contribution]] = field(default_factory=dict)
    graph_runners: dict[str, list[Contribution]] = field(default_factory=dict)
    layer_ops: dict[str, list[Contribution]] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def chosen(table: dict, key: Any, platform: str) -> Contribution | None:
        """The contribution under ``key`` that ``platform`` uses: one registered for this platform
        by name wins over one registered for every platform (the core's references) whichever
        loaded first; among equals the last one wins. Nothing is imported."""
        candidates = [c for c in table.get(key, []) if c.runs_on(platform)]
        named = [c for c in candidates if c.platforms is not None]
        return (named or candidates or [None])[-1]

    @staticmethod
    def pick(table: dict, key: Any, platform: str) -> Any | None:
        """The factory of ``chosen(table, key, platform)``; a ``"module:attr"`` registration is
        imported here (``load_target``)."""
        c = Registries.chosen(table, key, platform)
        return None if c is None else load_target(c.factory)

    @staticmethod
    def names_for(table: dict, platform: str) -> list:
        return sorted((k for k, cs in table.items() if any(c.runs_on(platform) for c in cs)),
                      key=lambda k: (k is None, str(k)))


class PluginHost:
    """Loads plugins into a pluggy manager and collects their contributions."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("infer")
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self.failures: list[PluginRecord] = []
        self.registries = Registries()
        self._matrix: SupportMatrix | None = None
        self._probes: dict[str, ProbeResult] | None = None

    # -- loading ---------------------------------------------------------------------------
    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
            rec = PluginRecord(name=ep.name, module=ep.value,
                               version=ep.dist.version if ep.dist else "")
            try:
                module = ep.load()
            except Exception as exc:  # recorded for doctor, never swallowed silently
                rec.error = f"import failed: {type(exc).__name__}: {exc}"
                self._record(rec)
                continue
            self.add_module(module, rec)

    def add_module(self, module: ModuleType | object, rec: PluginRecord | None = None) -> bool:
        """Register one plugin object (module or instance). Returns whether it was accepted."""
        name = getattr(module, "__name__", type(module).__name__)
        rec = rec or PluginRecord(name=name, module=name)
        declared = getattr(module, "INFER_API_VERSION", None)
        if declared is None:
            rec.error = "does not declare INFER_API_VERSION"
        elif int(declared) != hookspecs.API_VERSION:
            rec.error = (f"built for infer plugin API {declared}, this infer-core speaks "
                         f"{hookspecs.API_VERSION}: install a matching version of the plugin")
        else:
            try:
                self.pm.register(module, name=rec.name)
                rec.loaded = True
            except Exception as exc:
                rec.error = f"registration failed: {type(exc).__name__}: {exc}"
        self._record(rec)
        if rec.loaded:
            self._collect(module, rec.name)
        return rec.loaded

    def _record(self, rec: PluginRecord) -> None:
        self.records.append(rec)
        if not rec.loaded:
            self.failures.append(rec)

    def _call_hook(self, hook_name: str, plugin: str, **kwargs: Any) -> None:
        """``pm.hook.<hook_name>(**kwargs)`` with only ``plugin``'s implementations; a raise is
        recorded against ``plugin`` (with the hook's name and a short traceback)."""
        others = [obj for name, obj in self.pm.list_name_plugin() if name != plugin and obj is not None]
        caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
        try:
            caller(**kwargs)
        except Exception as exc:
            self.failures.append(PluginRecord(
                name=plugin, module=plugin,
                error=f"{hook_name} failed: {type(exc).__name__}: {exc}\n"
                      f"{traceback.format_exc(limit=3)}"))

    def _check_marks(self, module: Any, plugin: str) -> None:
        """Record hook-like functions pluggy will not call: a ``register_*`` hook name defined
        without ``@hookimpl``, and a ``@hookimpl`` whose name matches no hook specification."""
        problems = []
        for attr in HOOK_NAMES:
            fn = getattr(module, attr, None)
            if callable(fn) and self.pm.parse_hookimpl_opts(module, attr) is None:
                problems.append(f"{attr} is not marked @hookimpl (from infer.core.hookspecs), so it "
                                f"is not called")
        for caller in self.pm.get_hookcallers(module) or []:
            if not caller.has_spec():
                problems.append(f"@hookimpl {caller.name} matches no hook of infer.core.hookspecs "
                                f"(known: {', '.join(HOOK_NAMES)})")
        if problems:
            self.failures.append(PluginRecord(name=plugin, module=plugin, error="; ".join(problems)))

    def _collect(self, module: Any, plugin: str) -> None:
        """Run this plugin's register_* hooks (start-up only) into the registries."""
        reg = self.registries

        def add(table: dict) -> Callable[..., None]:
            def register(key: Any, factory: Any, platforms: Any = None) -> None:
                plats = None if platforms is None else tuple(
                    [platforms] if isinstance(platforms, str) else platforms)
                table.setdefault(key, []).append(Contribution(factory, plats, plugin))
            return register

        def add_platform(name: str, probe: Callable, factory: Callable) -> None:
            reg.platforms[name] = PlatformSpec(name, probe, factory, plugin)

        def add_model(arch: str, cls: Any) -> None:
            reg.models[arch] = cls

        hooks = {
            "register_platforms": add_platform,
            "register_attention_backends": add(reg.attention),
            "register_linear_methods": add(reg.linear),
            "register_moe_runners": add(reg.moe),
            "register_communicators": add(reg.communicators),
            "register_graph_runners": add(reg.graph_runners),
            "register_layer_ops": add(reg.layer_ops),
            "register_models": add_model,
        }
        self._check_marks(module, plugin)
        for hook_name, register in hooks.items():
            self._call_hook(hook_name, plugin, register=register)
        self._matrix = None

    # -- support matrix ----------------------------------------------------------------------
    @property
    def matrix(self) -> SupportMatrix:
        if self._matrix is None:
            matrix = SupportMatrix()

            def register(platform_or_path: Any, entries: Any = None, generations: Any = ()) -> None:
                if entries is None:  # a data-file path
                    platform, gens, rows = load_data_file(platform_or_path)
                    matrix.add(platform, rows, gens)
                else:
                    matrix.add(platform_or_path, entries, generations)

            for plugin, _ in self.pm.list_name_plugin():  # in load order: later rows override
                self._call_hook("register_support_matrix", plugin, register=register)
            self._matrix = matrix
        return self._matrix

    # -- probing and selection ------------------------------------------------------------
    def probe_all(self) -> dict[str, ProbeResult]:
        if self._probes is None:
            probes = {}
            for name, spec in self.registries.platforms.items():
                try:
                    probes[name] = spec.probe()
                except Exception as exc:
                    probes[name] = ProbeResult.not_found(
                        name, f"probe raised {type(exc).__name__}: {exc}")
            self._probes = probes
        return self._probes

    def select(self, device: str | None = None) -> Platform:
        """The one active platform: ``device`` (or INFER_DEVICE), else the single accelerator
        found, else CPU. Raises PlatformSelectionError with an actionable message otherwise."""
        device = device or os.environ.get("INFER_DEVICE") or None
        if device in ("auto", ""):
            device = None
        probes = self.probe_all()
        if device is not None:
            if device not in self.registries.platforms:
                known = ", ".join(sorted(self.registries.platforms)) or "none"
                raise PlatformSelectionError(
                    f"--device {device}: no installed plugin provides this platform "
                    f"(installed platforms: {known}); install infer-plugin-{device}")
            result = probes[device]
            if not result.found:
                raise PlatformSelectionError(f"--device {device}: {result.reason}")
            chosen = result
        else:
            accels = [p for p in probes.values() if p.found and p.is_accelerator]
            if len(accels) > 1:
                names = ", ".join(sorted(p.platform for p in accels))
                raise PlatformSelectionError(
                    f"several accelerator platforms found ({names}); choose one with --device "
                    f"or INFER_DEVICE")
            if accels:
                chosen = accels[0]
            else:
                hosts = [p for p in probes.values() if p.found and not p.is_accelerator]
                if not hosts:
                    raise PlatformSelectionError(
                        "no usable platform found; install infer-plugin-cpu (pip install "
                        "infer-plugin-cpu) or a plugin for your accelerator")
                chosen = hosts[0]
        platform = self.registries.platforms[chosen.platform].factory(chosen)
        platform.bind_matrix(self.matrix)
        return platform


_HOST: PluginHost | None = None


def get_plugin_host() -> PluginHost:
    """The process-wide plugin host, loaded from entry points on first use."""
    global _HOST
    if _HOST is None:
        host = PluginHost()
        host.load_entry_points()
        _HOST = host
    return _HOST


def reset_plugin_host(host: PluginHost | None = None) -> None:
    """Replace the process-wide host (tests use this to install a fresh manager)."""
    global _HOST
    _HOST = host
