"""Packaging: built wheels of the core and the CPU plugin work in a fresh virtualenv, and the
editable install maps infer.core / infer.server / infer.cli onto core/, server/, cli/.

The fresh virtualenv gets the two wheels with ``--no-deps``. Their third-party dependencies
(torch is a multi-gigabyte download) come from this interpreter's site-packages through a
filtered view: a folder of links to every entry there except infer's own distributions, its
editable-install hooks and the ``.pth`` files, put on the venv's path by one ``.pth`` line. So
the developer environment's editable infer and its plugins cannot leak in; the test checks that
infer is imported from the venv and that only the CPU plugin (and the core's own) is found.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INFER_OWN = re.compile(r"^(infer$|infer[_-]|__editable__)|\.pth$", re.IGNORECASE)
IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "tests")


def _run(cmd: list[str], timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Wheels of infer-core and infer-plugin-cpu, built from copies of the sources."""
    tmp = tmp_path_factory.mktemp("wheels")
    src = tmp / "src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / item, src / item)
    for folder in ("core", "server", "cli", "launcher"):
        shutil.copytree(ROOT / folder, src / folder, ignore=IGNORE)
    shutil.copytree(ROOT / "plugins" / "cpu", tmp / "cpu", ignore=IGNORE)
    house = tmp / "wheelhouse"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(house), str(src), str(tmp / "cpu")])
    found = {w.name.split("-")[0]: w for w in house.glob("*.whl")}
    assert set(found) == {"infer_core", "infer_plugin_cpu"}, found
    return found


def test_core_wheel_contents(wheels):
    names = set(zipfile.ZipFile(wheels["infer_core"]).namelist())
    for required in ("infer/core/hookspecs.py", "infer/core/plugins.py", "infer/core/support.py",
                     "infer/core/support_core.yaml", "infer/core/config/flags.json",
                     "infer/cli/main.py", "infer/cli/doctor.py", "infer/server/__init__.py",
                     "infer/__main__.py", "infer/launch_server.py"):
        assert required in names, required
    assert "infer/__init__.py" not in names  # infer stays a namespace package
    assert not any(n.startswith(("core/", "cli/", "server/", "tests/")) for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    eps = zipfile.ZipFile(wheels["infer_core"]).read(meta).decode()
    assert "infer = infer.cli.main:app" in eps


def test_cpu_wheel_contents(wheels):
    zf = zipfile.ZipFile(wheels["infer_plugin_cpu"])
    names = set(zf.namelist())
    assert {"infer_cpu/__init__.py", "infer_cpu/probe.py", "infer_cpu/support.yaml"} <= names
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[infer.plugins]" in zf.read(meta).decode() and "cpu = infer_cpu" in zf.read(meta).decode()


def third_party_view(dest: Path) -> Path:
    """Links to this interpreter's site-packages entries, minus infer's own and every .pth."""
    dest.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not INFER_OWN.search(entry.name):
            (dest / entry.name).symlink_to(entry)
    return dest


@pytest.mark.slow
def test_fresh_virtualenv_runs_doctor(wheels, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    view = third_party_view(tmp_path / "third_party")
    (Path(purelib.stdout.strip()) / "zz_third_party.pth").write_text(f"{view}\n")
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheels["infer_core"]),
          str(wheels["infer_plugin_cpu"])])

    where = _run([str(py), "-c", "import infer.core, infer.cli.doctor, infer_cpu; "
                  "print(infer.core.__file__); print(infer_cpu.__file__)"], cwd=tmp_path)
    for line in where.stdout.split():
        assert Path(line).resolve().is_relative_to(env_dir.resolve()), line

    out = _run([str(env_dir / "bin" / "infer"), "doctor", "--json"], cwd=tmp_path, timeout=120)
    report = json.loads(out.stdout)
    as_module = _run([str(py), "-m", "infer", "doctor", "--json"], cwd=tmp_path, timeout=120)
    assert json.loads(as_module.stdout)["active"] == report["active"]  # python -m infer is infer
    launch = _run([str(py), "-m", "infer.launch_server", "--help"], cwd=tmp_path, timeout=120)
    assert "--model-path" in launch.stdout
    assert report["active"]["platform"] == "cpu", report["active"]
    plugins = {p["name"]: p for p in report["plugins"]}
    assert plugins["cpu"]["loaded"] and plugins["cpu"]["version"] == "0.1.0"
    assert set(plugins) <= {"cpu", "core-models"}  # nothing from the developer environment
    assert all(p["loaded"] for p in plugins.values()) and not report["failures"], plugins
    gen = report["active"]["generation"]
    rows = {r["key"]: r["status"] for r in report["matrix"]["cpu"][gen]}
    assert rows["--model-path"] == "supported"


def _installed_from_this_tree() -> bool:
    spec = importlib.util.find_spec("infer.core")
    return spec is not None and spec.origin is not None and \
        Path(spec.origin).resolve().is_relative_to(ROOT)


@pytest.mark.skipif(not _installed_from_this_tree(), reason="infer is not installed editable here")
def test_editable_install_maps_the_folders():
    for package, folder in (("infer.core", "core"), ("infer.server", "server"), ("infer.cli", "cli"),
                            ("infer.core.config", "core/config"), ("infer_cpu", "plugins/cpu/infer_cpu")):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None, package
        assert Path(spec.origin).resolve() == (ROOT / folder / "__init__.py").resolve(), package
    for module, path in (("infer.__main__", "launcher/__main__.py"),
                         ("infer.launch_server", "launcher/launch_server.py")):
        spec = importlib.util.find_spec(module)
        assert spec is not None and Path(spec.origin).resolve() == (ROOT / path).resolve(), module
    assert shutil.which("infer"), "the console script is installed"


def test_every_subpackage_is_listed_for_the_wheel():
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = {v: k for k, v in conf["package-dir"].items()}  # folder -> package
    on_disk = set()
    for folder, package in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([package, *rel.parts]))
    missing = sorted(on_disk - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
