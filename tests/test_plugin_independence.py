"""No plugin depends on another plugin: each one needs only infer-core (and its vendor libraries).

Every plugin under plugins/ is one distribution with one package (``infer_<name>``). Checked here:
  * its pyproject names no other plugin's distribution in ``dependencies`` or any extra;
  * its package (the installed code, not its tests) imports no other plugin's package, neither by
    an import statement, nor dynamically (``importlib.import_module``), nor through a
    ``"module:attr"`` registration string (``"infer_cpu.ops.attention:TorchNativeAttention"``).
The shared plain-torch references live in the core (``infer.core.ops.reference``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _plugins() -> dict[str, tuple[str, Path]]:
    """plugin folder name -> (distribution name, package folder)."""
    found = {}
    for pyproject in sorted(PLUGINS.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        entry = project["entry-points"]["infer.plugins"]
        package = next(iter(entry.values())).split(":")[0].split(".")[0]
        found[pyproject.parent.name] = (project["name"], pyproject.parent / package)
    return found


PLUGIN_INFO = _plugins()


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def dependency_violations(pyproject_text: str, others: set[str]) -> list[str]:
    """Requirements (plain or in an extra) naming one of the ``others`` distributions."""
    project = tomllib.loads(pyproject_text)["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return [r for r in reqs if _requirement_name(r) in others]


def import_violations(source: str, others: set[str]) -> list[tuple[int, str]]:
    """Imports of one of the ``others`` packages (statements, dynamic imports, registration
    strings such as ``"pkg.module:Class"``)."""
    module_path = re.compile(rf"^({'|'.join(map(re.escape, sorted(others)))})(\.\w+)*(:\w+)?$")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {a.name}") for a in node.names
                      if a.name.split(".")[0] in others]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in others:
            found.append((node.lineno, f"imports from {node.module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and module_path.match(node.value.strip()):
            found.append((node.lineno, f"names {node.value!r}"))
    return found


def test_plugins_are_found():
    assert {"cpu", "cuda"} <= set(PLUGIN_INFO)
    assert all(package.is_dir() for _, package in PLUGIN_INFO.values())


@pytest.mark.parametrize("plugin", sorted(PLUGIN_INFO))
def test_pyproject_depends_on_no_other_plugin(plugin):
    others = {dist for name, (dist, _) in PLUGIN_INFO.items() if name != plugin}
    pyproject = PLUGINS / plugin / "pyproject.toml"
    assert not dependency_violations(pyproject.read_text(), others), pyproject


@pytest.mark.parametrize("plugin", sorted(PLUGIN_INFO))
def test_package_imports_no_other_plugin(plugin):
    others = {package.name for name, (_, package) in PLUGIN_INFO.items() if name != plugin}
    problems = [f"{path}:{line}: {what}"
                for path in sorted(PLUGIN_INFO[plugin][1].rglob("*.py"))
                for line, what in import_violations(path.read_text(), others)]
    assert not problems, "\n".join(problems)


OTHERS = {"infer_cpu", "infer_rocm"}


@pytest.mark.parametrize("bad", [
    "import infer_cpu",
    "from infer_cpu.ops.linear import DenseLinearMethod",
    "import infer_rocm.kernels as k",
    "register('torch_native', 'infer_cpu.ops.attention:TorchNativeAttention', 'cuda')",
    "import importlib\nm = importlib.import_module('infer_cpu.kernels')",
])
def test_import_checker_catches(bad):
    assert import_violations(bad, OTHERS)


@pytest.mark.parametrize("good", [
    '"""Tested against infer_cpu\'s old references, now in the core."""',
    "from infer.core.ops.reference.linear import DenseLinearMethod",
    "from infer_cuda.kernels import gemv",
    "name = 'infer_cpu_kernels.c'",
    "from . import kernels",
])
def test_import_checker_allows(good):
    assert not import_violations(good, OTHERS)


def test_dependency_checker():
    text = ('[project]\nname = "infer-plugin-cuda"\ndependencies = ["infer-core>=0.1", '
            '"Infer_Plugin_CPU >= 0.1"]\n[project.optional-dependencies]\nx = ["infer-plugin-rocm[aiter]"]\n')
    assert dependency_violations(text, {"infer-plugin-cpu", "infer-plugin-rocm"}) == [
        "Infer_Plugin_CPU >= 0.1", "infer-plugin-rocm[aiter]"]
    assert not dependency_violations(text.replace("CPU", "cudax").replace("rocm", "x"),
                                     {"infer-plugin-cpu", "infer-plugin-rocm"})
