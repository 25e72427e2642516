"""How ``infer doctor`` shows its report: a summary by default (environment, plugins, devices, the
active platform, and per target the counts per status, what is experimental and what is not
implemented, by flag section), every matrix row with ``--full``, and markdown for the docs.

Flag names are never cut: lists wrap between names, and the full listing gives each row a line
of its own (name and status), its reason wrapped below.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import Any

from infer.core.plugins import PluginHost
from infer.core.support import PlatformMatrix, Status

NOT_INSTALLED = "not installed"
STYLE = {Status.SUPPORTED.value: "green", Status.EXPERIMENTAL.value: "yellow",
         Status.UNSUPPORTED.value: "red", Status.NOT_IMPLEMENTED.value: "dim"}


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n else "unknown"


def _counts(rows: list[dict[str, str]]) -> str:
    counts = Counter(r["status"] for r in rows)
    return ", ".join(f"{counts[s.value]} {s.value}" for s in Status)


def _section_of() -> dict[str, str]:
    try:
        from infer.core.config.flags import FLAG_SPECS
    except ImportError:
        return {}
    return {spec.flag: spec.section for spec in FLAG_SPECS.values()}


def by_section(keys: list[str]) -> dict[str, list[str]]:
    """Matrix keys (``--flag`` or ``--flag=value``) grouped by their flag's section, in order."""
    sections = _section_of()
    out: dict[str, list[str]] = {}
    for key in keys:
        out.setdefault(sections.get(key.split("=", 1)[0], "Other"), []).append(key)
    return out


def _print_names(console: Any, label: str, names: list[str], indent: str = "  ") -> None:
    """``label: a, b, c`` wrapped between names (never inside one) at the console width."""
    width = max(console.width, 40)
    text = f"{label}: " + ", ".join(names)
    for line in textwrap.wrap(text, width=width, initial_indent=indent,
                              subsequent_indent=indent * 2, break_long_words=False,
                              break_on_hyphens=False):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _header(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table

    env = Table(title="Environment", show_header=False)
    for k, v in report["environment"].items():
        env.add_row(k, v if v != NOT_INSTALLED else f"[dim]{v}[/dim]")
    console.print(env)

    plugins = Table(title="Plugins")
    for col in ("entry point", "module", "version", "status"):
        plugins.add_column(col, overflow="fold")
    for p in report["plugins"]:
        status = "[green]loaded[/green]" if p["loaded"] else f"[red]failed[/red]: {p['error']}"
        plugins.add_row(p["name"], p["module"], p["version"], status)
    for f in report["failures"]:
        plugins.add_row(f["name"], "", "", f"[red]hook failed[/red]: {f['error']}")
    console.print(plugins)

    devices = Table(title="Devices (each plugin's probe)")
    for col in ("platform", "found", "generation", "device, or why none", "count", "memory"):
        devices.add_column(col, overflow="fold")
    for name, d in report["devices"].items():
        if d["found"]:
            devices.add_row(name, "[green]yes[/green]", d["generation"], d["name"],
                            str(d["count"]), _gib(d["memory_bytes"]))
        else:
            devices.add_row(name, "[red]no[/red]", "", d["reason"], "", "")
    console.print(devices)

    active = report["active"]
    if "error" in active:
        console.print(f"[bold red]No active platform:[/bold red] {active['error']}")
        return
    console.print(f"Active platform: [bold]{active['platform']}[/bold], generation "
                  f"[bold]{active['generation']}[/bold] (torch device "
                  f"{active['torch_device']}, distributed backend {active['dist_backend']})")
    details = report["devices"].get(active["platform"], {}).get("details") or {}
    for key, value in details.items():
        console.print(f"  {key.replace('_', ' ')}: {value}")


def not_implemented(rows: list[dict[str, str]]) -> list[str]:
    """The not-implemented keys, leaving out a choice flag's own row where some of its values run
    (that row only covers the values not listed, e.g. ``--dtype`` beside ``--dtype=bfloat16``)."""
    runs = {r["key"].split("=", 1)[0] for r in rows if "=" in r["key"]
            and r["status"] in (Status.SUPPORTED.value, Status.EXPERIMENTAL.value)}
    return [r["key"] for r in rows if r["status"] == Status.NOT_IMPLEMENTED.value
            and ("=" in r["key"] or r["key"] not in runs)]


def _summary(console: Any, name: str, gen: str, rows: list[dict[str, str]]) -> None:
    console.print(f"\n[bold]Support matrix: {name} / {gen}[/bold] ({len(rows)} rows: {_counts(rows)})")
    for r in rows:
        if r["status"] == Status.EXPERIMENTAL.value:
            console.print(f"  experimental: {r['key']}" + (f" ({r['reason']})" if r["reason"] else ""),
                          markup=False, highlight=False, soft_wrap=True)
    missing = not_implemented(rows)
    if missing:
        console.print(f"  not implemented on {name} / {gen} ({len(missing)}), by section:")
        for section, keys in by_section(missing).items():
            _print_names(console, f"{section} ({len(keys)})", keys, indent="    ")


def _full_table(console: Any, name: str, gen: str, rows: list[dict[str, str]]) -> None:
    """Every row, by flag section: the name whole, its status, then the reason wrapped below."""
    console.print(f"\n[bold]Support matrix: {name} / {gen}[/bold] ({len(rows)} rows: {_counts(rows)})")
    width = max(console.width, 40)
    pad = min(max((len(r["key"]) for r in rows), default=0), width // 2)
    for section, keys in by_section([r["key"] for r in rows]).items():
        console.print(f"  [bold]{section}[/bold]")
        here = set(keys)
        for r in (row for row in rows if row["key"] in here):
            st = r["status"]
            console.print(f"    {r['key'].ljust(pad)} [{STYLE[st]}]{st}[/{STYLE[st]}]", highlight=False,
                          soft_wrap=True)
            note = r["reason"] + (f" (instead: {r['instead']})" if r["instead"] else "")
            for line in textwrap.wrap(note, width=width, initial_indent=" " * 6,
                                      subsequent_indent=" " * 6, break_long_words=False):
                console.print(line, markup=False, highlight=False, soft_wrap=True)


def render_rich(report: dict[str, Any], full: bool = False) -> None:
    """The report on the terminal: the summary, or with ``full`` every matrix row."""
    from rich.console import Console

    console = Console()
    _header(console, report)
    for name, gens in report["matrix"].items():
        for gen, rows in gens.items():
            (_full_table if full else _summary)(console, name, gen, rows)
    if not full and report["matrix"]:
        console.print("\nEvery row with its reason: infer doctor --full (or --json); another target: "
                      "--device NAME [--generation GEN]; all of them: --all")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(host: PluginHost, flags: list[str]) -> str:
    """Every platform's matrix, one table per platform with a column per generation."""
    lines = ["# infer support matrix", "",
             "Generated by `infer doctor --markdown` from the installed plugins' support data; "
             "do not edit by hand.", "",
             "Statuses: **supported** (implemented and tested here), **experimental** "
             "(implemented, not yet proven), **unsupported** (the hardware cannot), "
             "**not-implemented** (the hardware could; infer does not yet). A flag=value row "
             "overrides its flag's row for that value.", ""]
    for name, pm in sorted(host.matrix.platforms.items()):
        lines += _platform_markdown(name, pm, flags)
    return "\n".join(lines) + "\n"


def _platform_markdown(name: str, pm: PlatformMatrix, flags: list[str]) -> list[str]:
    gens = pm.generations
    tables = {g: pm.table(g, flags) for g in gens}
    keys = list(dict.fromkeys(e.key for g in gens for e in tables[g]))
    by = {g: {e.key: e for e in tables[g]} for g in gens}
    reasons = Counter(e.reason for g in gens for e in tables[g]
                      if e.status is not Status.SUPPORTED and e.reason)
    common = reasons.most_common(1)[0][0] if reasons else ""
    counts = Counter(e.status.value for g in gens for e in tables[g])
    out = [f"## {name}", "", f"Generations: {', '.join(gens)}. Rows: {len(keys)} per generation ("
           + ", ".join(f"{counts[s.value]} {s.value}" for s in Status) + " over all generations).",
           ""]
    if common:
        out += [f"A row that does not run and has no note has this reason: {common}.", ""]
    out += ["| flag | " + " | ".join(gens) + " | notes |",
            "|---|" + "---|" * len(gens) + "---|"]
    for key in keys:
        cells, notes = [], []
        for g in gens:
            e = by[g].get(key)
            cells.append(e.status.value if e else "not-implemented")
            if e and e.reason and e.reason != common:
                note = e.reason + (f" (instead: {e.instead})" if e.instead else "")
                if note not in notes:
                    notes.append(note)
        out.append(f"| `{_cell(key)}` | " + " | ".join(cells) + " | "
                   + _cell("; ".join(notes)) + " |")
    return out + [""]
