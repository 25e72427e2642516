"""Batch invariance of the float-activation block GEMM (``kernels.fgemm``) and of the decode
attention kernel used for every query row: a row's result is the same bits whatever the other
rows of the call, their number, the thread count, and (attention) whether the row came as a
prefill, an extend after cached keys or a decode step."""

from __future__ import annotations

import gguf
import pytest
import torch
from infer_cpu import kernels
from infer_cpu.quant.packing import Q, gguf_qweight

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason=f"native kernels unavailable: {kernels.status().detail}")


def _qweight(n: int, k: int, qtype: Q, seed: int):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return gguf_qweight(torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype)), qtype, n)


def _with_threads(n: int, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_fgemm_rows_do_not_depend_on_the_batch(qtype):
    qw = _qweight(75, 576, qtype, seed=3)
    bias = torch.randn(75)
    x = torch.randn(131, 576) * torch.rand(131, 1) * 3  # 131: past two 64-row blocks, odd tail
    alone = torch.cat([kernels.fgemm(x[i:i + 1], qw, bias) for i in range(x.shape[0])])
    for threads in (1, 2):
        for m in (2, 3, 4, 5, 31, 32, 64, 65, 131):
            got = _with_threads(threads, lambda m=m: kernels.fgemm(x[:m], qw, bias))
            assert torch.equal(got, alone[:m]), (threads, m)
    # a row placed anywhere in a batch (other rows, other tile position) keeps its bits
    perm = torch.randperm(131, generator=torch.Generator().manual_seed(0))
    assert torch.equal(kernels.fgemm(x[perm], qw, bias), alone[perm])
