"""The ``infer`` command line: ``serve`` plus the commands other modules provide, if present.

``cli/doctor.py``, ``cli/models.py``, ``cli/generate.py`` and ``cli/bench.py`` are mounted when they
exist: a module may expose a Typer app ``app`` (mounted as a sub-command group named after the
module) or a command function named after the module (mounted as a command).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

# torch's CPU ops run OpenMP teams whose threads, by default, spin at every barrier: on shared
# cores a descheduled peer then stalls the whole team (a 1 x 128 prefill of the default model took
# 2.6 s instead of 0.25 s under `infer bench one-batch` while another process ran). libgomp reads
# the policy once, when torch loads it, so the commands that run an engine in this process (bench,
# generate) need it set before their first torch import; the CPU plugin sets the same default for
# the server's engine process. A value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer
from infer.cli.common import ServerFlagsCommand
from infer.cli.serve import serve

app = typer.Typer(name="infer", help="infer: an LLM inference server with device plugins.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False)

app.command("serve", cls=ServerFlagsCommand,
            context_settings={"max_content_width": 200})(serve)


def _optional_module(name: str) -> ModuleType | None:
    """Import infer.cli.<name>; only that exact module being absent is tolerated."""
    full = f"infer.cli.{name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name == full:
            return None
        raise


def _mount(name: str) -> None:
    module = _optional_module(name)
    if module is None:
        return
    func = getattr(module, name, None)
    sub = getattr(module, "app", None)
    if callable(func) and not isinstance(func, typer.Typer):
        cls = ServerFlagsCommand if getattr(func, "_infer_server_flags", False) else None
        app.command(name, **({"cls": cls} if cls else {}))(func)
    elif isinstance(sub, typer.Typer):
        app.add_typer(sub, name=name)
    else:
        raise RuntimeError(f"{module.__name__} exposes neither a function {name!r} nor a Typer app")


for _name in ("doctor", "models", "generate", "bench"):
    _mount(_name)
