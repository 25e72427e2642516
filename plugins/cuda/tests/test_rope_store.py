"""The fused rotary + KV-store kernel against the plain-torch rotary reference and KV write
(fresh random inputs each case). Runs compiled on a GPU, or under TRITON_INTERPRET=1 (CI)."""

from __future__ import annotations

import pytest
import torch
from kernel_utils import CAN_RUN_KERNELS, KERNEL_DEVICE, SKIP_REASON, bf16_tol, rel_err

pytestmark = pytest.mark.skipif(not CAN_RUN_KERNELS, reason=SKIP_REASON)

PARAMS = {"rope_theta": 10000.0}


def _case(t: int, h: int, hkv: int, d: int, dtype: torch.dtype, gen: torch.Generator):
    """q/k/v as strided views into one fused projection [T, (H + 2 Hkv) * D], as the model
    passes them, and positions that repeat and skip (any order must work)."""
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=gen).to(dtype).to(KERNEL_DEVICE)
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(t, h, d), k.view(t, hkv, d), v.view(t, hkv, d)
    positions = torch.randint(0, 50, (t,), generator=gen).to(KERNEL_DEVICE)
    return q, k, v, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("h", "hkv", "d", "rot"), [(4, 2, 32, 32), (6, 3, 40, 40),
                                                    (8, 8, 64, 32), (2, 1, 16, 16)])
def test_rope_store_matches_reference(dtype, h, hkv, d, rot):
    from infer.core.model.layers.rotary import rope_table
    from infer.core.ops.attention import write_kv
    from infer.core.ops.layer_ops import rotary_ref
    from infer_cuda.kernels.kv_store import rope_store_kv

    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    t, page = 7, 4
    q, k, v, positions = _case(t, h, hkv, d, dtype, gen)
    cos_sin = rope_table(rot, 64, PARAMS).to(KERNEL_DEVICE)
    slots = torch.randperm(4 * page, generator=gen)[:t].to(KERNEL_DEVICE)
    kc = torch.full((4, page, hkv, d), float("nan"), dtype=dtype, device=KERNEL_DEVICE)
    vc = torch.full_like(kc, float("nan"))
    kc_ref, vc_ref = kc.clone(), vc.clone()

    q_out = rope_store_kv(q, k, v, positions, cos_sin, rot, kc, vc, slots)

    # the reference in float64: the kernel rounds once, the bf16 reference rounds per product
    q_ref, k_ref = rotary_ref(positions, q.double(), k.double(), cos_sin.double(), rot)
    write_kv(k_ref.to(dtype), v, kc_ref, vc_ref, slots)
    tol = bf16_tol() if dtype == torch.bfloat16 else 1e-5
    assert q_out.shape == q.shape and q_out.is_contiguous()
    assert rel_err(q_out, q_ref) < tol
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    assert rel_err(flat_k[slots], k_ref) < tol
    assert torch.equal(flat_v[slots], v)  # v is copied bit for bit
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=KERNEL_DEVICE)
    untouched[slots] = False
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()
    if rot < d:  # dims past the rotary part pass through unchanged
        assert torch.equal(q_out[..., rot:], q[..., rot:])


def test_rope_store_skips_negative_slots_but_rotates_q():
    from infer.core.model.layers.rotary import rope_table
    from infer.core.ops.layer_ops import rotary_ref
    from infer_cuda.kernels.kv_store import rope_store_kv

    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    q, k, v, positions = _case(3, 2, 1, 16, torch.float32, gen)
    cos_sin = rope_table(16, 64, PARAMS).to(KERNEL_DEVICE)
    kc = torch.zeros(2, 4, 1, 16, device=KERNEL_DEVICE)
    vc = torch.zeros_like(kc)
    q_out = rope_store_kv(q, k, v, positions, cos_sin, 16, kc, vc,
                          torch.tensor([5, -1, 0], device=KERNEL_DEVICE))
    q_ref, k_ref = rotary_ref(positions, q, k, cos_sin, 16)
    assert rel_err(q_out, q_ref) < 1e-5
    flat = kc.view(-1, 1, 16)
    assert rel_err(flat[5], k_ref[0]) < 1e-5 and rel_err(flat[0], k_ref[2]) < 1e-5
    assert flat[torch.tensor([1, 2, 3, 4, 6, 7])].abs().sum() == 0
    assert torch.equal(vc.view(-1, 1, 16)[0], v[2]) and vc.view(-1, 1, 16)[1:5].abs().sum() == 0


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_rope_store_fp8_cache(fp8):
    """An fp8 cache stores rotated k / k_scale and v / v_scale, saturated, exactly as the plain
    store kernel stores the reference-rotated k and v (same float32 value, same conversion)."""
    from infer.core.model.layers.rotary import rope_table
    from infer.core.ops.layer_ops import rotary_ref
    from infer_cuda.kernels.kv_store import rope_store_kv, store_kv

    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    q, k, v, positions = _case(5, 4, 2, 32, torch.bfloat16, gen)
    v = v * 1e5  # some values saturate at the fp8 maximum (e5m2: 57344)
    cos_sin = rope_table(32, 64, PARAMS).to(KERNEL_DEVICE)
    dt = getattr(torch, fp8)
    kc = torch.zeros(3, 4, 2, 32, dtype=dt, device=KERNEL_DEVICE)
    vc, kc_ref, vc_ref = torch.zeros_like(kc), torch.zeros_like(kc), torch.zeros_like(kc)
    slots = torch.tensor([0, 3, 7, 8, 11], device=KERNEL_DEVICE)
    rope_store_kv(q, k, v, positions, cos_sin, 32, kc, vc, slots, 0.5, 0.25)
    _, k_ref = rotary_ref(positions, q.float(), k.float(), cos_sin, 32)
    store_kv(k_ref, v.contiguous(), kc_ref, vc_ref, slots, 0.5, 0.25)
    # float32 rotation may differ in the last bit (FMA contraction), rarely one fp8 step apart
    assert rel_err(kc.float(), kc_ref.float()) < 0.02
    assert torch.equal(vc.view(torch.uint8), vc_ref.view(torch.uint8))
    assert vc.float().abs().max() == torch.finfo(dt).max
