"""`infer bench one-batch` / `offline` end with exit code 2 and the reason, never a stack trace,
when the engine cannot take the model (the server's and `infer generate`'s behaviour)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize("cmd", ["one-batch", "offline"])
@pytest.mark.parametrize("model", [None, "/no/such/model-dir"])
def test_a_model_the_engine_cannot_take_exits_2(cmd, model):
    from infer.cli.main import app

    args = ["bench", cmd] + (["--model-path", model] if model else [])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert (model or "--model-path") in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
