"""``python -m infer``: the ``infer`` command (serve, doctor, generate, bench, ...)."""

from __future__ import annotations

from infer.cli.main import app

if __name__ == "__main__":
    app(prog_name="infer")
