"""``infer models``: fetch and list the default models (``pull``, ``list``)."""

from __future__ import annotations

import typer

# The loader package imports torch; commands import it lazily so `infer --help` stays fast.
DEFAULT_ALIAS = "smollm2"

app = typer.Typer(help="Fetch and list the built-in default models.", no_args_is_help=True)


@app.command("pull")
def pull(alias: str = typer.Argument(DEFAULT_ALIAS, help="model alias, e.g. smollm2")) -> None:
    """Download a default model into the infer cache (nothing is fetched when it is cached)."""
    from infer.core.model.loader.default_model import (
        DEFAULT_MODELS,
        DefaultModelError,
        ensure_default_model,
    )

    if alias not in DEFAULT_MODELS:
        typer.echo(f"error: unknown model alias {alias!r} (known: {', '.join(DEFAULT_MODELS)})",
                   err=True)
        raise typer.Exit(2)
    try:
        path = ensure_default_model(alias)
    except DefaultModelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(str(path))


@app.command("list")
def list_models() -> None:
    """Show each alias, whether it is cached, and where."""
    from infer.core.model.loader.default_model import DEFAULT_MODELS, cache_dir, cached_path

    typer.echo(f"cache: {cache_dir()}")
    for alias, spec in DEFAULT_MODELS.items():
        path = cached_path(alias)
        state = "cached" if path.is_file() else "not downloaded"
        typer.echo(f"{alias}\t{state}\t{spec.description}\t{path if path.is_file() else ''}".rstrip())
