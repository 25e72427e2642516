"""Triton attention kernels against a float64 torch reference (fresh random inputs each case).

Runs compiled on a GPU, or on the CPU under TRITON_INTERPRET=1 (CI)."""

from __future__ import annotations

import pytest
import torch
from kernel_utils import (
    CAN_RUN_KERNELS,
    KERNEL_DEVICE,
    SKIP_REASON,
    bf16_tol,
    make_paged_batch,
    reference_attention,
    rel_err,
)

pytestmark = pytest.mark.skipif(not CAN_RUN_KERNELS, reason=SKIP_REASON)

CASES = [
    # prefix_lens, extend_lens, H, Hkv, D, page_size
    ([0, 5], [7, 3], 4, 2, 32, 4),
    ([17, 0, 33], [1, 20, 9], 8, 2, 64, 16),
    ([40], [1], 4, 4, 16, 1),
    ([3, 70], [1, 1], 6, 3, 40, 8),  # non-power-of-two head_dim and group
]


def _tol(dtype: torch.dtype) -> float:
    return bf16_tol() if dtype == torch.bfloat16 else 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_store_then_extend(case, dtype):
    from infer_cuda.kernels.extend_attention import extend_attention
    from infer_cuda.kernels.kv_store import store_kv

    prefix, ext, h, hkv, d, page = case
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    pb = make_paged_batch(prefix, ext, h, hkv, d, page, dtype, KERNEL_DEVICE, gen)
    store_kv(pb.k_new, pb.v_new, pb.k_cache, pb.v_cache, pb.slot_mapping)
    out = torch.full_like(pb.q, float("nan"))
    extend_attention(pb.q, pb.k_cache, pb.v_cache, pb.query_start_loc,
                     torch.tensor(prefix, dtype=torch.int32, device=KERNEL_DEVICE),
                     pb.block_tables, max(ext), out, scale=d ** -0.5, block_m=16, block_n=16)
    assert rel_err(out, reference_attention(pb, d ** -0.5)) < _tol(dtype)


@pytest.mark.parametrize("fused_merge", [False, True], ids=["merge-kernel", "fused-merge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_store_then_decode(dtype, num_splits, fused_merge):
    """Lengths 1..51 with 8 splits of 16 leave some splits empty (lse -inf), which the merge
    must skip; the fused merge must leave its tickets at 0 for the next launch."""
    from infer_cuda.kernels import decode_attention as da
    from infer_cuda.kernels.common import arrival_counters
    from infer_cuda.kernels.kv_store import store_kv

    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    prefix = [0, 9, 50, 33]
    pb = make_paged_batch(prefix, [1] * 4, 8, 2, 32, 4, dtype, KERNEL_DEVICE, gen)
    store_kv(pb.k_new, pb.v_new, pb.k_cache, pb.v_cache, pb.slot_mapping)
    expect = reference_attention(pb, 32 ** -0.5)
    for _ in range(2):  # a second launch reuses the tickets the first one left
        out = torch.full_like(pb.q, float("nan"))
        da.decode_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens, out,
                            scale=32 ** -0.5, num_splits=num_splits, block_n=16,
                            fused_merge=fused_merge)
        assert rel_err(out, expect) < _tol(dtype)
        assert int(arrival_counters(out.device, 8).count_nonzero()) == 0


def test_store_skips_negative_slots():
    from infer_cuda.kernels.kv_store import store_kv

    k = torch.randn(3, 2, 8, device=KERNEL_DEVICE)
    v = torch.randn(3, 2, 8, device=KERNEL_DEVICE)
    kc = torch.zeros(2, 4, 2, 8, device=KERNEL_DEVICE)
    vc = torch.zeros_like(kc)
    store_kv(k, v, kc, vc, torch.tensor([5, -1, 0], device=KERNEL_DEVICE))
    flat = kc.view(-1, 2, 8)
    assert torch.equal(flat[5], k[0]) and torch.equal(flat[0], k[2])
    assert flat[torch.tensor([1, 2, 3, 4, 6, 7])].abs().sum() == 0
    assert torch.equal(vc.view(-1, 2, 8)[0], v[2])


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("decode", [True, False])
def test_fp8_cache_with_scales(fp8, decode):
    """An fp8 cache stores k / k_scale; the kernels read it back times the scale. Reference:
    attention over the dequantized cache (the quantization error itself is not the kernels')."""
    from infer_cuda.kernels.decode_attention import decode_attention
    from infer_cuda.kernels.extend_attention import extend_attention
    from infer_cuda.kernels.kv_store import store_kv

    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    prefix, ext = ([6, 21], [1, 1]) if decode else ([6, 0], [5, 9])
    pb = make_paged_batch(prefix, ext, 4, 2, 32, 4, torch.bfloat16, KERNEL_DEVICE, gen)
    dt = getattr(torch, fp8)
    kc = torch.zeros(pb.k_cache.shape, dtype=dt, device=KERNEL_DEVICE)
    vc = torch.zeros_like(kc)
    ks, vs = 0.5, 0.25
    flat_k, flat_v = pb.k_cache.view(-1, 2, 32), pb.v_cache.view(-1, 2, 32)
    written = (~torch.isnan(flat_k[:, 0, 0])).nonzero().flatten()  # prefix slots
    store_kv(flat_k[written], flat_v[written], kc, vc, written, ks, vs)
    store_kv(pb.k_new, pb.v_new, kc, vc, pb.slot_mapping, ks, vs)
    out = torch.full_like(pb.q, float("nan"))
    if decode:
        decode_attention(pb.q, kc, vc, pb.block_tables, pb.seq_lens, out, 32 ** -0.5, 2, ks, vs,
                         block_n=16)
    else:
        extend_attention(pb.q, kc, vc, pb.query_start_loc,
                         torch.tensor(prefix, dtype=torch.int32, device=KERNEL_DEVICE),
                         pb.block_tables, max(ext), out, 32 ** -0.5, ks, vs, block_m=16, block_n=16)
    pb.k_cache = (kc.float() * ks).to(torch.bfloat16)
    pb.v_cache = (vc.float() * vs).to(torch.bfloat16)
    pb.k_new = pb.k_cache.view(-1, 2, 32)[pb.slot_mapping]
    pb.v_new = pb.v_cache.view(-1, 2, 32)[pb.slot_mapping]
    assert kc.float().abs().max() > 0
    assert rel_err(out, reference_attention(pb, 32 ** -0.5)) < bf16_tol()
