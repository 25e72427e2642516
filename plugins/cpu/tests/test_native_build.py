"""What `infer doctor` says about the native kernels, and the plain-torch fallback's reason."""

from __future__ import annotations

from infer_cpu import native_build
from infer_cpu.probe import probe


def test_describe_when_switched_off(monkeypatch):
    monkeypatch.setenv("INFER_CPU_KERNELS", "0")
    assert native_build.describe().startswith("off (INFER_CPU_KERNELS=0)")


def test_describe_without_a_compiler(monkeypatch):
    monkeypatch.delenv("INFER_CPU_KERNELS", raising=False)
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    assert "no C compiler" in native_build.describe()


def test_describe_before_and_after_a_build(monkeypatch, tmp_path):
    monkeypatch.delenv("INFER_CPU_KERNELS", raising=False)
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    cc = native_build.compiler()
    if cc is None:
        assert "no C compiler" in native_build.describe()
        return
    assert native_build.describe().startswith(f"compiled with {cc} on first use")
    path, flags = native_build.build(cc)
    assert path.is_file() and str(tmp_path) in str(path)
    assert native_build.describe() == f"built ({cc} {' '.join(flags)}): {path}"


def test_probe_reports_it():
    assert "native_kernels" in probe().device.details
