"""The native work pool's core swap (``kernels/infer_cpu_pool.h``, in the bf16 and the GGUF library):
a thread that holds a unit while another process keeps it off its core swaps cores with the thread
waiting for it.

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

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1024, generator=g)
    if sys.argv[1] == "bf16":  # the bf16 library's pool, through its GEMM
        from infer_cpu.kernels import bf16 as kb
        lib = kb.load()
        if lib is None:
            print(json.dumps({"skip": kb.detail()})); sys.exit(0)
        kb.set_call_threads(2)
        w = kb.pack(torch.randn(4096, 1024, generator=g))
        swaps, gemm = lib.infer_bf16_pool_swaps, lambda: kb.gemm(x, w)
    else:  # the GGUF library's, through the integer-activation GEMM on Q4_1 blocks
        import gguf
        from infer_cpu import kernels
        from infer_cpu.quant.packing import Q, gguf_qweight
        lib = kernels.load()
        if lib is None:
            print(json.dumps({"skip": kernels.status().detail})); sys.exit(0)
        torch.set_num_threads(2)
        wf = torch.randn(4096, 1024, generator=g)
        w = gguf_qweight(torch.from_numpy(gguf.quants.quantize(wf.numpy(), Q.Q4_1)), Q.Q4_1, 4096)
        w = w.with_activations("int16")
        swaps, gemm = lib.infer_pool_swaps, lambda: kernels.fgemm(x, w)
    quiet = gemm()
    mask = sorted(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    calls = same = 0
    try:
        start = swaps(-1)
        deadline = time.monotonic() + float(os.environ["SWAP_TEST_SECONDS"])
        while swaps(-1) == start and time.monotonic() < deadline:
            same += bool(torch.equal(gemm(), quiet))
            calls += 1
        made = swaps(-1) - start
    finally:
        for h in hogs:
            h.kill()
    for _ in range(20):  # a pinned thread undoes its pin at its next unit
        same += bool(torch.equal(gemm(), quiet))
        calls += 1
    pinned = {}
    for tid in os.listdir("/proc/self/task"):
        got = sorted(os.sched_getaffinity(int(tid)))
        if got != mask:
            pinned[tid] = got
    print(json.dumps({"swaps": made, "calls": calls, "same": same, "pinned": pinned}))
""")


def _child(lib: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, lib], capture_output=True, text=True, timeout=240,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in res:
        pytest.skip(res["skip"])
    return res


LIBS = pytest.mark.parametrize("lib", ["bf16", "gguf"])


@LIBS
def test_a_preempted_unit_holder_swaps_cores_and_results_do_not_change(lib):
    res = _child(lib, {"SWAP_TEST_SECONDS": "60"})
    assert res["swaps"] > 0, res
    assert res["same"] == res["calls"], res
    assert res["pinned"] == {}, res


@LIBS
def test_the_swap_can_be_turned_off(lib):
    res = _child(lib, {"INFER_CPU_POOL_SWAP": "0", "SWAP_TEST_SECONDS": "3"})
    assert res["swaps"] == 0 and res["pinned"] == {}, res
