"""What `infer doctor` says about the native kernels, and the plain-torch fallback's reason."""

from __future__ import annotations

import subprocess

import pytest
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


@pytest.mark.parametrize("source,lib_name", [
    (native_build.SOURCE, native_build.LIB_NAME), (native_build.BF16_SOURCE, native_build.BF16_LIB_NAME),
    (native_build.COMM_SOURCE, native_build.COMM_LIB_NAME)], ids=lambda p: getattr(p, "name", p))
def test_the_sources_build_with_the_first_flag_set(source, lib_name, monkeypatch, tmp_path):
    """Where the compiler takes the first flag set (-march=native), every shipped source builds
    with it (``native_build.build`` does not fall back): a source that only compiles with the
    fallback flags would otherwise serve, and pass every bit-for-bit test, as portable C."""
    cc = native_build.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    flags = native_build.FLAG_SETS[0]
    trivial = tmp_path / "t.c"
    trivial.write_text("int f(void) { return 0; }\n")
    if subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", str(tmp_path / "t.so"), str(trivial)],
                      capture_output=True).returncode:
        pytest.skip(f"{cc} does not take {' '.join(flags)}")
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path / "cache"))
    try:
        path, used = native_build.build(cc, source, lib_name)
    except RuntimeError as e:  # every flag set failed: the errors name them
        pytest.fail(str(e)[-2000:])
    assert used == flags and path.is_file()
