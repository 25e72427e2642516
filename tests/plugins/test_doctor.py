"""``infer doctor``: report contents, JSON, other targets' matrices, markdown, and speed hygiene."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import typer
from infer.cli import doctor as doc
from infer.core.plugins import get_plugin_host, reset_plugin_host
from typer.testing import CliRunner

app = typer.Typer()
app.command()(doc.doctor)
runner = CliRunner()


@pytest.fixture(autouse=True)
def _fresh_host(monkeypatch):
    """The real installed plugins, whatever host an earlier test left behind."""
    monkeypatch.delenv("INFER_DEVICE", raising=False)
    reset_plugin_host(None)
    yield
    reset_plugin_host(None)


def _json(*args: str) -> dict:
    res = runner.invoke(app, ["--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_json_report_on_this_machine():
    report = _json()
    assert report["active"]["platform"] == "cpu"
    gen = report["active"]["generation"]
    assert gen in ("amx", "avx512", "avx2", "arm", "x86_64")
    assert list(report["matrix"]) == ["cpu"] and list(report["matrix"]["cpu"]) == [gen]
    rows = {r["key"]: r for r in report["matrix"]["cpu"][gen]}
    assert rows["--model-path"]["status"] == "supported"
    assert len([k for k in rows if "=" not in k]) >= 336  # every flag has a row
    env = report["environment"]
    assert env["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert env["torch_npu"] == "not installed" and env["aiter"] == "not installed"
    names = {p["name"]: p for p in report["plugins"]}
    assert names["cpu"]["loaded"]


@pytest.mark.parametrize("platform", ["rocm", "ascend", "hpu"])
def test_absent_accelerators_say_why(platform):
    report = _json()
    dev = report["devices"].get(platform)
    if dev is None:
        pytest.skip(f"infer-plugin-{platform} not installed")
    if dev["found"]:
        pytest.skip(f"a {platform} device is present")
    assert dev["reason"]


def test_other_target_matrix():
    report = _json("--device", "ascend", "--generation", "A2")
    assert list(report["matrix"]) == ["ascend"] and list(report["matrix"]["ascend"]) == ["A2"]
    rows = {r["key"]: r for r in report["matrix"]["ascend"]["A2"]}
    assert rows["--model-impl"]["status"] == "unsupported"
    assert rows["--attention-backend=ascend"]["status"] == "experimental"  # infer-plugin-ascend, #16
    both = _json("--device", "ascend")
    assert list(both["matrix"]["ascend"]) == ["A2", "A3"]


def test_all_targets():
    report = _json("--all")
    host = get_plugin_host()
    expected = {(n, g) for n, pm in host.matrix.platforms.items() for g in pm.generations}
    got = {(n, g) for n, gens in report["matrix"].items() for g in gens}
    assert got == expected and ("ascend", "A3") in got


def test_all_json_agrees_with_the_ascend_page():
    import csv
    from pathlib import Path

    tsv = Path(__file__).resolve().parents[3] / "shared" / "flags" / "server-flags.tsv"
    if not tsv.exists():
        pytest.skip(f"{tsv} not present")
    report = _json("--all")
    if "ascend" not in report["matrix"]:
        pytest.skip("infer-plugin-ascend not installed")
    # page x: unsupported; page v: experimental where infer-plugin-ascend implements it (#16),
    # else not-implemented; never supported without a run on an NPU
    expect = {"no": {"unsupported"}, "yes": {"not-implemented", "experimental"}}
    with tsv.open(newline="") as f:
        flags = list(csv.DictReader(f, delimiter="\t"))
    for gen, column in (("A2", "ascend_a2"), ("A3", "ascend_a3")):
        rows = {r["key"]: r["status"] for r in report["matrix"]["ascend"][gen]}
        for rec in flags:
            if rec[column] in expect:
                assert rows[rec["flag"]] in expect[rec[column]], (gen, rec["flag"])


@pytest.mark.parametrize("args,needle", [(["--device", "tpu"], "--device tpu"),
                                         (["--device", "ascend", "--generation", "A9"], "A9")])
def test_bad_target_exits_2(args, needle):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and needle in res.output


def test_rich_output_names_active_platform():
    res = runner.invoke(app, [])
    assert res.exit_code == 0, res.output
    assert "Active platform: cpu" in res.output and "Support matrix: cpu" in res.output


def test_markdown(tmp_path):
    out = tmp_path / "m.md"
    res = runner.invoke(app, ["--markdown", "--output", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    for name in get_plugin_host().matrix.platforms:
        assert f"## {name}" in text
    assert "| `--attention-backend=fa3` |" in text


def test_doctor_imports_no_vendor_library():
    code = ("import sys; from infer.cli.doctor import collect; "
            "from infer.core.plugins import get_plugin_host; collect(get_plugin_host(), all_targets=True); "
            "print(sorted(m for m in ('torch_npu', 'aiter', 'habana_frameworks', 'flashinfer') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _fake_package(root, dist: str, module: str, files: dict[str, str]) -> None:
    """An installed distribution ``dist`` 0.1 providing the package ``module`` with ``files``."""
    pkg = root / module
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")


def test_pypi_aiter_is_not_taken_for_amds(tmp_path, monkeypatch):
    # PyPI's "aiter" (async iterators) installs a module "aiter" too; only AMD's has aiter/jit/core.py
    _fake_package(tmp_path, "aiter", "aiter", {"async_tools.py": ""})
    monkeypatch.syspath_prepend(str(tmp_path))
    version = doc.package_version(*doc.PACKAGES["aiter"])
    assert version.startswith("not installed") and "another project" in version


@pytest.mark.parametrize("dist", ["amd-aiter", "aiter"])  # the wheel's name, or a source build's
def test_amds_aiter_is_recognised_by_its_contents(tmp_path, monkeypatch, dist):
    _fake_package(tmp_path, dist, "aiter", {"jit/__init__.py": "", "jit/core.py": ""})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert doc.package_version(*doc.PACKAGES["aiter"]) == "0.1"


def _not_implemented_keys(gen: str) -> list[str]:
    from infer.cli.doctor_render import not_implemented

    return not_implemented(_json()["matrix"]["cpu"][gen])


def test_default_output_is_a_summary_with_whole_names():
    res = runner.invoke(app, [], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    out = res.output
    gen = _json()["active"]["generation"]
    assert "…" not in out and len(out.splitlines()) < 300  # the full table is ~1,400 lines
    assert f"Support matrix: cpu / {gen}" in out and " supported, " in out and " not-implemented)" in out
    assert f"not implemented on cpu / {gen}" in out and "infer doctor --full" in out
    names = set(re.findall(r"--[a-z0-9][a-z0-9=._-]*", out))
    missing = [k for k in _not_implemented_keys(gen) if k not in names]
    assert not missing, missing  # each one whole (never cut), and none left out
    assert "--dtype," not in out  # a choice flag whose values run is not "not implemented"


def test_full_output_has_every_row_with_whole_names():
    res = runner.invoke(app, ["--full"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    names = set(re.findall(r"--[a-z0-9][a-z0-9=._-]*", res.output))
    rows = _json()["matrix"]["cpu"][_json()["active"]["generation"]]
    assert [r["key"] for r in rows if r["key"] not in names] == []


def test_a_target_without_its_plugin_names_the_package_to_install():
    import infer_cpu
    from infer.core.model import registry
    from infer.core.plugins import PluginHost

    host = PluginHost()  # as after the quickstart: the CPU plugin only
    host.add_module(infer_cpu)
    host.add_module(registry)
    with pytest.raises(ValueError) as err:
        doc.collect(host, device="ascend", generation="A3")
    assert "pip install infer-plugin-ascend" in str(err.value)
    with pytest.raises(ValueError, match="install the third-party plugin"):
        doc.collect(host, device="tpu")
