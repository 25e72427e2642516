"""The `infer` command line sets OpenMP's sleeping waits before torch can load libgomp (spinning
waits stall every barrier on shared cores), and keeps a value the user set."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = ("import sys; import infer.cli.main, os; "
         "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")


def _run(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    return subprocess.run([sys.executable, "-c", CHECK], env=env, check=True,
                          capture_output=True, text=True).stdout.split()


def test_default_is_passive_and_set_before_torch():
    assert _run(None) == ["PASSIVE", "False"]  # set, and torch not loaded yet


def test_a_users_value_wins():
    assert _run("ACTIVE")[0] == "ACTIVE"
