"""``infer doctor``: what this machine has, which plugins loaded, which platform is active, and
what the support matrix says there.

Fast by construction: versions come from package metadata and torch's version file (no vendor
library is imported), plugins' probes are the cheap ones the contract asks for, and the matrix
is read from the plugins' data files. ``collect`` builds the report as plain data; the command
renders it as rich tables, JSON or markdown.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import platform as pyplatform
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
from infer.cli.doctor_render import render_markdown, render_rich
from infer.core.plugins import PlatformSelectionError, PluginHost, get_plugin_host
from infer.core.support import Entry

# label -> (distribution names to try, import name)
PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "infer-core": (("infer-core",), "infer.core"),
    "torch": (("torch",), "torch"),
    "triton": (("triton", "pytorch-triton-rocm"), "triton"),
    "transformers": (("transformers",), "transformers"),
    "flashinfer": (("flashinfer-python", "flashinfer"), "flashinfer"),
    "torch_npu": (("torch-npu", "torch_npu"), "torch_npu"),
    "habana_frameworks": (("habana-torch-plugin", "habana_frameworks"), "habana_frameworks"),
    "aiter": (("amd-aiter",), "aiter"),
}
# Import names that unrelated PyPI projects share: the file inside the package that only the one
# meant has. (PyPI's "aiter" is an async-iterator library; AMD's aiter, distribution "amd-aiter" or
# a source build named "aiter", carries its kernel JIT in aiter/jit/core.py.)
MARKERS: dict[str, str] = {"aiter": "jit/core.py"}
NOT_INSTALLED = "not installed"
# The platforms this repository ships a plugin for (README's table): platform -> distribution.
BUILTIN_PLUGINS = {name: f"infer-plugin-{name}" for name in ("cpu", "cuda", "rocm", "ascend", "hpu")}
DEFAULT_MARKDOWN = Path("docs/support-matrix.md")


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def package_version(dists: tuple[str, ...], module: str) -> str:
    """The installed version, or "not installed"; never imports the package. Where another
    project shares the import name (``MARKERS``), the module must hold the marker file."""
    marker = MARKERS.get(module)
    if marker is not None:
        where = _package_dir(module)
        if where is None:
            return NOT_INSTALLED
        if not (where / marker).is_file():
            return f"{NOT_INSTALLED} (the '{module}' module at {where} is another project)"
        dists = (*dists, module)  # a source build keeps the import name as distribution name
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    found = marker is not None or _package_dir(module) is not None
    return "installed (version unknown)" if found else NOT_INSTALLED


def torch_build() -> str:
    """"CUDA 13.0", "ROCm/HIP 6.2", or "CPU", read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return NOT_INSTALLED
    try:
        text = Path(spec.origin).with_name("version.py").read_text()
    except OSError:
        return "unknown"
    fields = {}
    for name in ("cuda", "hip"):
        m = re.search(rf"^{name}\s*(?::[^=]+)?=\s*(.+)$", text, re.MULTILINE)
        try:
            fields[name] = ast.literal_eval(m.group(1).strip()) if m else None
        except (ValueError, SyntaxError):
            fields[name] = None
    if fields["hip"]:
        return f"ROCm/HIP {fields['hip']}"
    if fields["cuda"]:
        return f"CUDA {fields['cuda']}"
    return "CPU"


def environment() -> dict[str, str]:
    env = {"python": f"{pyplatform.python_version()} ({sys.executable})",
           "os": f"{pyplatform.system()} {pyplatform.release()} {pyplatform.machine()}"}
    for label, (dists, module) in PACKAGES.items():
        env[label] = package_version(dists, module)
    if env["torch"] != NOT_INSTALLED:
        env["torch"] += f" ({torch_build()} build)"
    return env


def known_flags() -> list[str]:
    """Every server flag in inventory order, from the settings table when it is installed."""
    try:
        from infer.core.config.flags import FLAG_SPECS
    except ImportError:
        return []
    return [spec.flag for spec in FLAG_SPECS.values()]


def entry_dict(e: Entry) -> dict[str, str]:
    return {"key": e.key, "status": e.status.value, "reason": e.reason, "instead": e.instead}


def targets(host: PluginHost, device: str | None, generation: str | None, all_targets: bool,
            active: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The (platform, generation) pairs whose matrix to show. Raises ValueError on bad input."""
    matrix = host.matrix
    if all_targets:
        return [(name, gen) for name, pm in sorted(matrix.platforms.items())
                for gen in pm.generations]
    if device is None and generation is None:
        return [active] if active else []
    name = device or (active[0] if active else None)
    if name is None:
        raise ValueError("--generation needs --device when no platform is active")
    pm = matrix.platforms.get(name)
    if pm is None:
        known = ", ".join(sorted(matrix.platforms)) or "none"
        raise ValueError(f"--device {name}: no installed plugin has support data for it "
                         f"(installed platforms: {known}); {install_hint(name)}")
    if generation is None:
        return [(name, g) for g in pm.generations]
    if generation not in pm.generations:
        raise ValueError(f"--generation {generation}: not a generation of {name} "
                         f"(known: {', '.join(pm.generations)})")
    return [(name, generation)]


def install_hint(platform: str) -> str:
    """What to install for ``platform``'s plugin."""
    dist = BUILTIN_PLUGINS.get(platform)
    if dist is None:
        return (f"no plugin of this repository is named {platform!r} (they are "
                f"{', '.join(BUILTIN_PLUGINS)}); install the third-party plugin that provides it")
    return f"install its plugin: pip install {dist} (from a clone of infer: pip install -e plugins/{platform})"


def collect(host: PluginHost, device: str | None = None, generation: str | None = None,
            all_targets: bool = False) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    report: dict[str, Any] = {"environment": environment()}
    report["plugins"] = [
        {"name": r.name, "module": r.module, "version": r.version, "loaded": r.loaded,
         "error": r.error} for r in host.records]
    recorded = {id(r) for r in host.records}
    report["failures"] = [{"name": r.name, "error": r.error} for r in host.failures
                          if id(r) not in recorded]
    devices = {}
    for name, res in sorted(host.probe_all().items()):
        d = res.device
        devices[name] = {
            "found": res.found, "reason": res.reason, "accelerator": res.is_accelerator,
            "plugin": host.registries.platforms[name].plugin,
            **({"generation": d.generation, "name": d.name, "count": d.count,
                "memory_bytes": d.memory_bytes, "details": d.details} if d else {})}
    report["devices"] = devices
    active: tuple[str, str] | None = None
    try:
        plat = host.select()
        active = (plat.name, plat.generation)
        report["active"] = {"platform": plat.name, "generation": plat.generation,
                            "torch_device": plat.torch_device, "dist_backend": plat.dist_backend}
    except PlatformSelectionError as exc:
        report["active"] = {"error": str(exc)}
    flags = known_flags()
    matrices: dict[str, dict[str, list[dict[str, str]]]] = {}
    for name, gen in targets(host, device, generation, all_targets, active):
        pm = host.matrix.platforms[name]
        matrices.setdefault(name, {})[gen] = [entry_dict(e) for e in pm.table(gen, flags)]
    report["matrix"] = matrices
    return report


def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    device: Annotated[str | None, typer.Option(
        "--device", help="Show this platform's matrix instead of the active one's.")] = None,
    generation: Annotated[str | None, typer.Option(
        "--generation", help="With --device: only this generation's matrix.")] = None,
    all_targets: Annotated[bool, typer.Option(
        "--all", help="Show the matrix of every platform and generation.")] = False,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="Write every platform's matrix as markdown tables to --output.")] = False,
    output: Annotated[Path, typer.Option(
        "--output", help="Where --markdown writes.")] = DEFAULT_MARKDOWN,
    full: Annotated[bool, typer.Option(
        "--full", help="Show every matrix row with its reason, not the summary.")] = False,
) -> None:
    """Show the environment, plugins, devices, the active platform and a summary of its support
    matrix (counts per status, what is not implemented); --full shows every row."""
    host = get_plugin_host()
    if markdown:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(render_markdown(host, known_flags()))
        typer.echo(f"wrote {output}")
        return
    try:
        report = collect(host, device, generation, all_targets)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        render_rich(report, full=full)


def main() -> None:
    typer.run(doctor)


if __name__ == "__main__":
    main()
