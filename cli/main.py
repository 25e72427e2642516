"""The ``infer`` command line: ``serve`` plus the commands other modules provide, if present.

``cli/doctor.py``, ``cli/models.py``, ``cli/generate.py`` and ``cli/bench.py`` are mounted when they
exist: a module may expose a Typer app ``app`` (mounted as a sub-command group named after the
module) or a command function named after the module (mounted as a command).
"""

from __future__ import annotations

import importlib
from types import ModuleType

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
