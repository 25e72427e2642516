"""Developer sessions: ``nox -s tests``, ``lint``, ``serve`` (the quickstart), ``bench``, ``device``.

Plugins are found as ``plugins/*/pyproject.toml``, never listed here, so a new plugin folder is
installed and tested without touching this file. The virtualenvs see the system site-packages:
torch is a multi-gigabyte download, so an already installed torch is reused, while infer itself
and its plugins are always installed into the session's own environment (editable).

``device`` runs the GPU-marked tests and is opt-in: it is not in the default session list.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PLUGINS = sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))
VENV = ["--system-site-packages"]

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


def install_infer(session: nox.Session, extras: str = "test") -> None:
    session.install("-e", f".[{extras}]" if extras else ".")
    for plugin in PLUGINS:
        session.install("-e", str(plugin.relative_to(ROOT)))


def plugin_test_dirs() -> list[str]:
    return [str(p.relative_to(ROOT) / "tests") for p in PLUGINS if (p / "tests").is_dir()]


@nox.session(venv_params=VENV)
def tests(session: nox.Session) -> None:
    """Every CPU test: the core's tests/ and each plugin's tests/ (GPU tests skip themselves)."""
    install_infer(session)
    session.run("python", "-m", "pytest", "tests", *plugin_test_dirs(), *session.posargs)


@nox.session(venv_params=VENV)
def lint(session: nox.Session) -> None:
    """ruff over the whole tree (configuration in pyproject.toml)."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".", *session.posargs)


@nox.session(venv_params=VENV)
def serve(session: nox.Session) -> None:
    """The quickstart: install the core and the CPU plugin, serve the default model.

    Extra arguments go to ``infer serve`` (``nox -s serve -- --port 8000``).
    """
    session.install("-e", ".", "-e", "plugins/cpu")
    session.run("infer", "doctor")
    session.run("infer", "serve", "--model-path", "smollm2", *session.posargs)


@nox.session(venv_params=VENV)
def bench(session: nox.Session) -> None:
    """The benchmarks (numbers printed, never asserted): ``infer bench`` with the given args; with
    none, the CPU peer comparison ``benchmarks/run_cpu.py`` (writes benchmarks/RESULTS.md).

    The peers are benchmark-only: accelerate (transformers' GGUF loader) and llama-cpp-python
    (compiled from source when no wheel fits: about an hour on 2 cores).
    """
    install_infer(session, extras="bench")
    if session.posargs:
        session.run("infer", "bench", *session.posargs)
        return
    session.install("accelerate>=1.0", "llama-cpp-python>=0.3")
    session.run("python", "benchmarks/run_cpu.py")


@nox.session(name="openapi-fuzz", venv_params=VENV)
def openapi_fuzz(session: nox.Session) -> None:
    """schemathesis over a served tiny model's /openapi.json, every operation (about 1,400 generated
    requests by default): no response >= 500, and the server still answers normally after it.
    Posargs go to tests/server/openapi_fuzz.py (``-- --max-examples 40 --seed 7``)."""
    install_infer(session)
    session.run("python", "tests/server/openapi_fuzz.py", *session.posargs)


@nox.session(venv_params=VENV)
def device(session: nox.Session) -> None:
    """On a CUDA machine (opt-in), in one call: the CUDA plugin's tests compiled on the GPU (every
    Triton kernel and backend against its reference, the engine end to end), the ``gpu``-marked
    tests elsewhere, then the GPU benchmarks reported in benchmarks/RESULTS.md. Posargs replace
    the benchmark's arguments (default: Llama-3-8B shape, batch 1 and 64, torch.compile and
    prefill CUDA graphs; then the Mixtral shape)."""
    install_infer(session)
    session.run("python", "-m", "pytest", "plugins/cuda/tests")
    session.run("python", "-m", "pytest", "-m", "gpu", "tests",
                *[d for d in plugin_test_dirs() if not d.startswith("plugins/cuda")])
    bench = ["python", "benchmarks/gpu/bench_engine.py"]
    if session.posargs:
        session.run(*bench, *session.posargs)
        return
    fast = ["--enable-torch-compile", "--enable-piecewise-cuda-graph"]
    session.run(*bench, "--model", "llama3-8b", "--batch", "1", "64", *fast)
    session.run(*bench, "--model", "mixtral-16l", "--batch", "1", "64", "--max-total-tokens",
                "40000", *fast)


@nox.session(venv_params=VENV)
def ascend(session: nox.Session) -> None:
    """On an Ascend A2/A3 machine with CANN (opt-in): the Ascend plugin's tests on the NPU
    (INFER_ASCEND_HARDWARE=1 runs them on the real torch_npu instead of the emulation; the tests
    of the emulation itself skip), then a decode benchmark of the default model at batch 1 and 64.
    Posargs replace the benchmark's arguments."""
    install_infer(session)
    session.install("-e", "plugins/ascend[npu]")
    session.run("python", "-m", "pytest", "plugins/ascend/tests", env={"INFER_ASCEND_HARDWARE": "1"})
    bench = session.posargs or ["--model-path", "smollm2", "--dtype", "bfloat16",
                                "--batch-size", "1", "--batch-size", "64"]
    session.run("infer", "bench", "one-batch", "--device", "ascend", *bench)
