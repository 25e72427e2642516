"""``infer serve``: parse every flag, build ServerArgs, select the platform, gate, then serve.

Everything before ``launch_server`` is cheap: a flag the device cannot run ends the command with
exit code 2 and one message within seconds, before any weight is loaded.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Optional

import typer
from infer.cli.common import fail, with_server_flags
from infer.core.config import ConfigError, ServerArgs
from infer.core.engine import gc_watch


def _configure_logging(args: ServerArgs) -> None:
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@with_server_flags(positional={"model": "model_path"})
def serve(model: Annotated[Optional[str], typer.Argument(
              help="The model, as vLLM's `vllm serve MODEL` takes it: the same as --model-path.",
              metavar="MODEL", show_default=False)] = None,
          *, server_args: ServerArgs) -> None:
    """Serve a model over HTTP (OpenAI-compatible API). Takes every SGLang server flag."""
    # MODEL arrives as server_args.model_path (with_server_flags consumes it, as a user setting)
    gc_watch.pause_for_startup()  # the HTTP process's, until it is ready (server.launch)
    try:
        _serve(server_args)
    finally:  # on every way out (a bad flag's exit included): collection back on
        gc_watch.resume()


def _serve(args: ServerArgs) -> None:
    from infer.core.config.gate import run_gate
    from infer.core.plugins import PlatformSelectionError

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
    if (args.node_rank or 0) > 0:  # a worker node: its ranks join node 0's engine; no HTTP here
        from infer.core.config.views import EngineConfig
        from infer.core.engine.multiproc import run_node

        gc_watch.resume()  # this process only waits for its ranks
        typer.echo(f"node {args.node_rank} of {args.nnodes}: starting its ranks, joining "
                   f"{args.dist_init_addr}", err=True)
        sys.exit(run_node(EngineConfig.from_server_args(args), report.platform.name))
    try:
        from infer.server.launch import launch_server
    except ModuleNotFoundError as exc:
        if exc.name != "infer.server.launch":
            raise
        fail(f"settings are valid for {report.platform.name} ({report.platform.generation}), but "
             "serving is not available yet in this build (infer.server.launch is missing)")
    sys.exit(launch_server(args))


def _check_model_source(args: ServerArgs) -> None:
    """Resolve --model-path (local path, alias, or cached hub repo), read its config and check
    --context-length, --tokenizer-path and --trust-remote-code against it before the engine
    process starts, so a wrong value is one message and exit code 2, not a traceback from the
    engine. No weight is read."""
    from infer.core.config.views import ParallelConfig
    from infer.core.model.loader.model_config import check_load_settings
    from infer.core.model.loader.source import ModelSourceError

    parallel = ParallelConfig.from_server_args(args)  # --enable-expert-parallel: ep = tp

    try:
        check_load_settings(args.model_path, load_format=args.load_format, revision=args.revision,
                            tokenizer_path=args.tokenizer_path, context_length=args.context_length,
                            trust_remote_code=args.trust_remote_code,
                            skip_tokenizer_init=args.skip_tokenizer_init,
                            tp_size=args.tp_size or 1, ep_size=parallel.ep_size)
    except (ModelSourceError, ConfigError) as exc:
        fail(str(exc))
