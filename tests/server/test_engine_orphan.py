"""An engine process whose HTTP process died while the engine was still starting (loading the
model) stops as soon as its step loop begins, instead of idling forever as an orphan. Before the
fix the loop took the parent pid from ``os.getppid()`` when it began, which by then named the
reaper that had adopted it, so the death was never seen."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

LAUNCHER = textwrap.dedent("""
    import multiprocessing as mp, os, sys, time

    def engine(addr):
        import zmq
        from infer.server.engine_proc import _EngineLoop

        time.sleep(1.5)  # "loading the model": the HTTP process dies meanwhile

        class Core:
            def has_work(self):
                return False

            def stats(self):
                return {}

        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(addr)
        push = ctx.socket(zmq.PUSH)
        push.connect(addr)  # stats go nowhere in particular; the loop only needs a socket
        _EngineLoop(Core(), pull, push, watchdog_s=0).run()

    if __name__ == "__main__":
        p = mp.get_context("spawn").Process(target=engine, args=(sys.argv[1],))
        p.start()
        with open(sys.argv[2], "w") as f:
            f.write(str(p.pid))
        os._exit(0)  # the HTTP process dies abruptly (as under SIGKILL): no cleanup of children
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is as good as gone
        return f.read().split(")")[-1].split()[0] != "Z"


def test_engine_started_under_a_dead_http_process_exits(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    pid_file = tmp_path / "engine.pid"
    subprocess.run([sys.executable, str(script), f"ipc://{tmp_path}/loop", str(pid_file)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=True)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the orphaned engine process kept running after its HTTP process died"
