"""The emulated MC2 ops (npu_emulation/torch_npu/_moe_dist.py) over eight gloo ranks standing in
for HCCL (A3 allows ep_world_size 8 at the least): dispatch's expand_x / expand_idx /
ep_recv_counts / expert_token_nums layouts against hand-computed ones, combine's weighted sums
with float32 scales, int32 ids, equal and per-rank batch sizes (global_bs), and the documented
argument constraints. The checks run in the ranks (mc2_worker.py)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest

from .conftest import HARDWARE
from .ranks import run_ranks

HERE = Path(__file__).resolve().parent
WORLD = 8


@pytest.mark.slow
@pytest.mark.skipif(HARDWARE, reason="tests the emulation itself")
def test_mc2_dispatch_combine_semantics():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import mc2_worker

    failed = mp.get_context("spawn").Event()
    run_ranks(mc2_worker.run, WORLD, lambda r, port, done: (r, WORLD, port, done, failed))
    assert not failed.is_set(), "a rank's checks failed (its traceback is in the captured stderr)"
