"""``python -m infer.launch_server --model-path ...``: SGLang's way to start a server
(``python -m sglang.launch_server``), the same command as ``infer serve`` with the same flags."""

from __future__ import annotations

import sys

PROG = "python -m infer.launch_server"


def main(argv: list[str] | None = None) -> None:
    """Run ``infer serve`` with ``argv`` (default: this process's arguments); exits."""
    import typer
    from infer.cli.main import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    serve.main(args=sys.argv[1:] if argv is None else argv, prog_name=PROG)


if __name__ == "__main__":
    main()
