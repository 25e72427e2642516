"""``infer serve``: parse every flag, build ServerArgs, select the platform, gate, then serve.

Everything before ``launch_server`` is cheap: a flag the device cannot run ends the command with
exit code 2 and one message within seconds, before any weight is loaded.
"""

from __future__ import annotations

import logging
import sys

import typer
from infer.cli.common import fail, with_server_flags
from infer.core.config import ConfigError, ServerArgs


def _configure_logging(args: ServerArgs) -> None:
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@with_server_flags
def serve(*, server_args: ServerArgs) -> None:
    """Serve a model over HTTP (OpenAI-compatible API). Takes every SGLang server flag."""
    from infer.core.config.gate import run_gate
    from infer.core.plugins import PlatformSelectionError

    args = server_args
    _configure_logging(args)
    try:
        report = run_gate(args)
    except PlatformSelectionError as exc:
        fail(str(exc))
    except ConfigError as exc:  # GateError included
        fail(str(exc))
    for w in report.warnings:
        typer.echo(f"warning: {w}", err=True)
    _check_model_source(args)
    try:
        from infer.server.launch import launch_server
    except ModuleNotFoundError as exc:
        if exc.name != "infer.server.launch":
            raise
        fail(f"settings are valid for {report.platform.name} ({report.platform.generation}), but "
             "serving is not available yet in this build (infer.server.launch is missing)")
    sys.exit(launch_server(args))


def _check_model_source(args: ServerArgs) -> None:
    """Resolve --model-path (local path, alias, or cached hub repo) before the engine process
    starts, so a wrong path is one message and exit code 2, not a traceback from the engine."""
    from infer.core.model.loader.source import ModelSourceError, resolve_source

    try:
        resolve_source(args.model_path, args.load_format, args.revision)
    except ModelSourceError as exc:
        fail(str(exc))
