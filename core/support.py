"""The support-matrix model: which flag (or flag=value) works on which device generation.

One data source per plugin (a YAML file the plugin registers through ``register_support_matrix``)
feeds flag gating at start-up, ``infer doctor`` and the generated tables in docs/. Features that
the hardware-independent core implements (scheduler, server, sampling) are listed once in
``core/support_core.yaml``; a plugin whose platform runs the core engine sets ``include_core: true``
to inherit them.

Data file format::

    platform: cpu
    generations: [avx512, amx, arm]
    include_core: true
    entries:
      - flag: --attention-backend        # flag name as on the command line
        value: torch_native              # optional: the row is for flag=value only
        status: supported                # supported | experimental | unsupported | not-implemented
        generations: [amx]               # optional: explicit set; omitted means every generation
        reason: why (required unless supported)
        instead: what to use instead (optional)

Lookup order: a flag=value row for the generation, then a flag row, else ``not-implemented``.
Later rows override earlier ones for the same key and generation, so a plugin's own rows override
the core's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class Status(str, enum.Enum):
    SUPPORTED = "supported"
    EXPERIMENTAL = "experimental"
    UNSUPPORTED = "unsupported"
    NOT_IMPLEMENTED = "not-implemented"

    @property
    def runs(self) -> bool:
        return self in (Status.SUPPORTED, Status.EXPERIMENTAL)


@dataclass(frozen=True)
class Entry:
    flag: str
    status: Status
    value: str | None = None
    generations: frozenset[str] | None = None  # None: every generation of the platform
    reason: str = ""
    instead: str = ""

    @property
    def key(self) -> str:
        return self.flag if self.value is None else f"{self.flag}={self.value}"


DEFAULT_REASON = "infer does not implement this yet on this platform"


@dataclass
class PlatformMatrix:
    platform: str
    generations: list[str]
    rows: dict[tuple[str, str], Entry] = field(default_factory=dict)  # (key, generation) -> entry

    def add(self, entry: Entry) -> None:
        for gen in entry.generations or self.generations:
            self.rows[(entry.key, gen)] = entry

    def lookup(self, generation: str, flag: str, value: Any = None) -> Entry:
        if value is not None:
            hit = self.rows.get((f"{flag}={_value_str(value)}", generation))
            if hit is not None:
                return hit
        hit = self.rows.get((flag, generation))
        if hit is not None:
            return hit
        return Entry(flag=flag, value=None if value is None else _value_str(value),
                     status=Status.NOT_IMPLEMENTED, reason=DEFAULT_REASON)

    def keys(self) -> list[str]:
        return sorted({k for k, _ in self.rows})

    def column(self, generation: str) -> list[Entry]:
        """Every explicit row that applies to ``generation``, ordered by key."""
        return [self.rows[(k, generation)] for k in self.keys() if (k, generation) in self.rows]

    def table(self, generation: str, flags: Iterable[str] = ()) -> list[Entry]:
        """One row per flag of ``flags`` (looked up, so unlisted ones read not-implemented), each
        followed by its flag=value rows, then the explicit rows of any other flag."""
        by_flag: dict[str, list[Entry]] = {}
        for e in self.column(generation):
            if e.value is not None:
                by_flag.setdefault(e.flag, []).append(e)
        order = list(dict.fromkeys(flags))
        seen = set(order)
        order += sorted({e.flag for e in self.column(generation)} - seen)
        out = []
        for flag in order:
            out.append(self.lookup(generation, flag))
            out += by_flag.get(flag, [])
        return out

    def values(self, generation: str, flag: str, runs_only: bool = True) -> list[str]:
        """The flag=value keys listed for ``flag`` on ``generation`` (only those that run, by
        default): the alternatives an error message can offer."""
        out = []
        for e in self.column(generation):
            if e.flag == flag and e.value is not None and (e.status.runs or not runs_only):
                out.append(e.value)
        return out


def _value_str(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


class SupportMatrix:
    """All platforms' matrices, built from the plugins' data sources."""

    def __init__(self) -> None:
        self.platforms: dict[str, PlatformMatrix] = {}

    def add(self, platform: str, entries: Iterable[Entry], generations: Iterable[str] = ()) -> None:
        pm = self.platforms.get(platform)
        if pm is None:
            pm = self.platforms[platform] = PlatformMatrix(platform, list(generations))
        else:
            for g in generations:
                if g not in pm.generations:
                    pm.generations.append(g)
        for e in entries:
            pm.add(e)

    def lookup(self, platform: str, generation: str, flag: str, value: Any = None) -> Entry:
        pm = self.platforms.get(platform)
        if pm is None:
            return Entry(flag=flag, status=Status.NOT_IMPLEMENTED,
                         reason=f"no support data for platform {platform!r}")
        return pm.lookup(generation, flag, value)

    def to_dict(self) -> dict[str, dict[str, dict[str, dict[str, str]]]]:
        """platform -> generation -> key -> {status, reason, instead}, for JSON output."""
        return {
            name: {gen: {e.key: {"status": e.status.value, "reason": e.reason,
                                 "instead": e.instead} for e in pm.column(gen)}
                   for gen in pm.generations}
            for name, pm in sorted(self.platforms.items())
        }


def parse_entries(rows: Iterable[dict[str, Any]]) -> list[Entry]:
    out = []
    for row in rows:
        gens = row.get("generations")
        value = row.get("value")
        out.append(Entry(
            flag=row["flag"],
            value=None if value is None else _value_str(value),
            status=Status(row["status"]),
            generations=frozenset(gens) if gens else None,
            reason=row.get("reason", ""),
            instead=row.get("instead", ""),
        ))
    return out


CORE_DATA = Path(__file__).with_name("support_core.yaml")


def load_data_file(path: str | Path) -> tuple[str, list[str], list[Entry]]:
    """Read one plugin's YAML data source: (platform, generations, entries incl. core rows)."""
    data = yaml.safe_load(Path(path).read_text())
    entries: list[Entry] = []
    if data.get("include_core"):
        core = yaml.safe_load(CORE_DATA.read_text()) or {}
        entries += parse_entries(core.get("entries", []))
    entries += parse_entries(data.get("entries", []))
    return data["platform"], list(data.get("generations", [])), entries
