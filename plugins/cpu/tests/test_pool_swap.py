"""The native work pool's core swap (``kernels/infer_cpu_pool.h``): a thread that holds a unit while
another process keeps it off its core swaps cores with the thread waiting for it.

Run in a child process with busy processes competing for the cores: the swap has to happen, every
result has to stay bit-equal to the quiet run's, and afterwards no pool thread may be left pinned
(each one's affinity is the process's again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="the core swap needs Linux and two CPUs")

CHILD = textwrap.dedent("""
    import json, os, subprocess, sys, time
    import torch
    from infer_cpu.kernels import bf16 as kb

    lib = kb.load()
    if lib is None:
        print(json.dumps({"skip": kb.detail()})); sys.exit(0)
    kb.set_call_threads(2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1024, generator=g)
    w = kb.pack(torch.randn(4096, 1024, generator=g))
    quiet = kb.gemm(x, w)
    mask = sorted(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    calls = same = 0
    try:
        start = lib.infer_bf16_pool_swaps(-1)
        deadline = time.monotonic() + float(os.environ["SWAP_TEST_SECONDS"])
        while lib.infer_bf16_pool_swaps(-1) == start and time.monotonic() < deadline:
            same += bool(torch.equal(kb.gemm(x, w), quiet))
            calls += 1
        swaps = lib.infer_bf16_pool_swaps(-1) - start
    finally:
        for h in hogs:
            h.kill()
    for _ in range(20):  # a pinned thread undoes its pin at its next unit
        same += bool(torch.equal(kb.gemm(x, w), quiet))
        calls += 1
    pinned = {}
    for tid in os.listdir("/proc/self/task"):
        got = sorted(os.sched_getaffinity(int(tid)))
        if got != mask:
            pinned[tid] = got
    print(json.dumps({"swaps": swaps, "calls": calls, "same": same, "pinned": pinned}))
""")


def _child(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=240,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in res:
        pytest.skip(res["skip"])
    return res


def test_a_preempted_unit_holder_swaps_cores_and_results_do_not_change():
    res = _child({"SWAP_TEST_SECONDS": "60"})
    assert res["swaps"] > 0, res
    assert res["same"] == res["calls"], res
    assert res["pinned"] == {}, res


def test_the_swap_can_be_turned_off():
    res = _child({"INFER_CPU_POOL_SWAP": "0", "SWAP_TEST_SECONDS": "3"})
    assert res["swaps"] == 0 and res["pinned"] == {}, res
