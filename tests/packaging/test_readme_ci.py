"""The README's quickstart, .ci/run and the noxfile agree with each other and with the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quickstart_commands() -> list[str]:
    """The set-up commands of the quickstart: bash lines that start by installing infer."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [line for block in blocks for line in block.strip().splitlines()
            if line.startswith("pip install")]


def test_quickstart_is_two_commands():
    serve, test = _quickstart_commands()
    assert "plugins/cpu" in serve and "infer serve" in serve
    assert '".[test]"' in test and "plugins/*/" in test and "pytest" in test


def test_ci_runs_exactly_the_readme_test_command():
    _, test = _quickstart_commands()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test in ci_lines


def test_noxfile_finds_every_plugin():
    pytest.importorskip("nox")
    import importlib.util

    spec = importlib.util.spec_from_file_location("infer_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    on_disk = {p.parent.name for p in ROOT.glob("plugins/*/pyproject.toml")}
    assert {p.name for p in module.PLUGINS} == on_disk and "cpu" in on_disk
    assert "plugins/cpu/tests" in module.plugin_test_dirs() or not (ROOT / "plugins/cpu/tests").is_dir()


def _quickstart() -> str:
    return (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]


def test_quickstart_says_how_to_get_the_cpu_torch_and_the_openai_client():
    text = " ".join(_quickstart().split())  # prose wraps anywhere
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in text
    client = text.index("from openai import OpenAI")
    assert "pip install openai" in text[:client]  # said before the example that needs it


def test_readme_names_the_entry_points_that_exist():
    import importlib.util

    text = " ".join(_quickstart().split())
    for module in ("infer", "infer.launch_server"):
        assert f"python -m {module} " in text
        assert importlib.util.find_spec(module if module != "infer" else "infer.__main__") is not None
    assert "infer serve smollm2" in text
