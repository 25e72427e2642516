"""The start-up gate: every explicitly set flag is checked against the active platform's matrix.

Runs before any weight is loaded. An unsupported or not-implemented flag (or flag=value) raises
``GateError`` with one message naming the flag, the value, the device and generation, the reason
and the alternatives that do run here; an experimental one is a warning. Then the platform's
default adjustments are applied to the settings the user left unset, each one logged.

A setting explicitly given its default value changes nothing, so it is not gated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from infer.core.config.flags import FLAG_SPECS, OPEN_CHOICES, ConfigError, FlagSpec
from infer.core.config.parallel import check_parallel_setup
from infer.core.config.server_args import PLATFORM, ServerArgs
from infer.core.platform import Platform, SettingAdjustment
from infer.core.support import Entry, Status

log = logging.getLogger("infer.config")

_BY_FLAG: dict[str, FlagSpec] = {s.flag: s for s in FLAG_SPECS.values()}


class GateError(ConfigError):
    """Explicit settings the active platform cannot run. ``problems`` lists (flag, value, entry)."""

    def __init__(self, message: str, problems: list[tuple[str, Any, Entry]]) -> None:
        super().__init__(message)
        self.problems = problems


@dataclass
class GateReport:
    platform: Platform
    warnings: list[str] = field(default_factory=list)
    adjustments: list[SettingAdjustment] = field(default_factory=list)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "" if value else "false"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def _device(platform: Platform) -> str:
    return f"device {platform.name} (generation {platform.generation})"


def _registered(host: Any, dest: str, platform: Platform) -> list[str]:
    table = getattr(host.registries, OPEN_CHOICES[dest], {}) if host is not None else {}
    return [str(k) for k in host.registries.names_for(table, platform.name) if k is not None] \
        if table else []


def _candidates(spec: FlagSpec, host: Any, platform: Platform) -> list[Any]:
    values = list(spec.choices or [])
    if spec.dest in OPEN_CHOICES:
        values += [v for v in _registered(host, spec.dest, platform) if v not in values]
    return values


def alternatives(spec: FlagSpec, value: Any, matrix: Any, platform: Platform, host: Any = None
                 ) -> list[str]:
    """The other values of a choice flag whose matrix status runs on this platform/generation."""
    out = []
    for cand in _candidates(spec, host, platform):
        if cand == value:
            continue
        if matrix.lookup(platform.name, platform.generation, spec.flag, cand).status.runs:
            out.append(str(cand))
    return out


def _problem_line(args: ServerArgs, spec: FlagSpec, value: Any, entry: Entry, platform: Platform,
                  alts: list[str]) -> str:
    shown = f"{spec.flag} {_fmt(value)}".rstrip()
    given = args.spelling(spec.dest)
    if given != spec.flag:
        shown += f" (given as {given})"
    verdict = "is not supported" if entry.status is Status.UNSUPPORTED else "is not implemented"
    line = f"{shown} {verdict} on {_device(platform)}: {entry.reason or 'no reason recorded'}."
    hints = []
    if alts:
        hints.append(f"values of {spec.flag} that run here: {', '.join(alts)}")
    if entry.instead:
        hints.append(f"instead: {entry.instead}")
    if not alts and not entry.instead:
        hints.append(f"remove {given}")
    return line + " " + "; ".join(hints)


def check_flags(args: ServerArgs, platform: Platform, host: Any = None) -> list[str]:
    """Gate every explicit setting; returns the warnings (experimental), raises GateError."""
    matrix = host.matrix if host is not None else platform._matrix
    if matrix is None:
        raise RuntimeError("the platform has no support matrix bound")
    problems: list[tuple[str, Any, Entry]] = []
    lines: list[str] = []
    warnings_out: list[str] = []
    for flag, value in args.explicit_flags():
        spec = _BY_FLAG[flag]
        if value == spec.default:
            continue
        keyed = spec.choices is not None or spec.dest in OPEN_CHOICES or spec.is_bool
        items = value if (keyed and isinstance(value, list)) else [value]
        for item in items:
            if spec.dest in OPEN_CHOICES and item not in _candidates(spec, host, platform):
                entry = Entry(flag=flag, value=str(item), status=Status.NOT_IMPLEMENTED,
                              reason=f"no installed plugin registers {item!r} for {platform.name}")
            else:
                entry = matrix.lookup(platform.name, platform.generation, flag,
                                      item if keyed else None)
            if entry.status is Status.EXPERIMENTAL:
                msg = (f"{flag} {_fmt(item)}".rstrip() + f" is experimental on {_device(platform)}"
                       + (f": {entry.reason}" if entry.reason else ""))
                warnings_out.append(msg)
                log.warning(msg)
            elif not entry.status.runs:
                alts = alternatives(spec, item, matrix, platform, host) if keyed and not spec.is_bool \
                    else []
                problems.append((flag, item, entry))
                lines.append(_problem_line(args, spec, item, entry, platform, alts))
    if problems:
        head = lines[0] if len(lines) == 1 else (
            f"{len(lines)} settings cannot run on {_device(platform)}:\n  " + "\n  ".join(lines))
        raise GateError(head, problems)
    return warnings_out


def apply_platform_defaults(args: ServerArgs, platform: Platform) -> list[SettingAdjustment]:
    """Apply ``platform.default_adjustments(args)`` to unset settings only, logging each change.

    Idempotent: a default already applied to these settings (they travel, provenance included, to
    the engine process, which gates them again) is neither applied nor logged a second time."""
    applied = []
    for adj in platform.default_adjustments(args) or []:
        if adj.name not in FLAG_SPECS:
            raise ValueError(f"platform {platform.name} adjusts unknown setting {adj.name!r}")
        if args.is_set(adj.name):
            log.info("keeping %s=%r (set explicitly; platform %s would use %r)",
                     adj.name, getattr(args, adj.name), platform.name, adj.value)
            continue
        old = getattr(args, adj.name)
        if args.provenance[adj.name] == PLATFORM and old == adj.value:
            continue  # applied (and logged) by an earlier gate run: the CLI's, before the engine's
        args.set_platform_default(adj.name, adj.value, adj.reason)
        log.info("platform default: %s %r -> %r (%s)", FLAG_SPECS[adj.name].flag, old, adj.value,
                 adj.reason or platform.name)
        applied.append(adj)
    return applied


def run_gate(args: ServerArgs, platform: Platform | None = None, host: Any = None) -> GateReport:
    """Select the platform (unless given), check every explicit flag, then apply platform defaults.

    Raises ``PlatformSelectionError`` (from the plugin host) or ``GateError``.
    """
    if platform is None or host is None:
        from infer.core.plugins import get_plugin_host

        host = host or get_plugin_host()
        platform = platform or host.select(args.device)
    warnings_out = check_flags(args, platform, host)
    check_parallel_setup(args, platform)
    adjustments = apply_platform_defaults(args, platform)
    return GateReport(platform=platform, warnings=warnings_out, adjustments=adjustments)
