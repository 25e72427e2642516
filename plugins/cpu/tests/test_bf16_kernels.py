"""The bf16 kernels (infer_cpu.kernels.bf16) against plain torch: the pair-packed layout, the
GEMM on every ISA path this compiler can build here (M 1..64, odd K, N tails, threads, strides,
float32/bf16 in and out, bias), the whole bf16 decode stack against a torch reference of the
same step, and the fall-back contract (an input a kernel does not take gives None)."""

from __future__ import annotations

import ctypes
import platform
import subprocess

import pytest
import torch
from infer.core.model.layers.rotary import rope_table
from infer.core.ops.layer_ops import rms_norm_ref, rotary_ref, silu_and_mul_ref
from infer_cpu.kernels import bf16 as kb
from infer_cpu.native_build import compiler

pytestmark = pytest.mark.skipif(kb.load() is None, reason=f"bf16 kernels unavailable: {kb.detail()}")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _case(m: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4  # row scales differ
    return x, w, torch.randn(n, generator=g)


def _check_gemm(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """y against the exact product of the bf16-rounded activations (float64): within the float32
    summation bound (K + 1) * 2^-23 * (sum |x_k w_k| + |bias|) per element, plus half a bf16 ulp
    for bf16 y."""
    xb = x.bfloat16().double()
    b = bias.double() if bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
    want = xb @ w.double().t() + b
    bound = (x.shape[1] + 1) * 2.0 ** -23 * (xb.abs() @ w.double().abs().t() + b.abs()) + 1e-30
    if y.dtype == torch.bfloat16:
        bound = bound + want.abs() * 2.0 ** -8
    err = (y.double() - want).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3e}"


def test_pack_layout_and_round_trip():
    w = torch.randn(37, 11).bfloat16()
    p = kb.pack(w)
    assert p.data.shape == (3, 6, 16, 2)  # ceil(37 / 16) blocks, ceil(11 / 2) pairs
    for n, k in [(0, 0), (5, 7), (17, 10), (36, 3), (20, 9)]:
        assert p.data[n // 16, k // 2, n % 16, k % 2] == w[n, k]
    assert (p.data[2, :, 5:] == 0).all() and (p.data[:, 5, :, 1] == 0).all()  # padding
    assert torch.equal(p.unpack(), w)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 17, 33, 37, 64, 130])
@pytest.mark.parametrize("k,n", [(576, 67), (37, 16), (1, 5), (129, 130)])
def test_gemm_float32_in_out(m, k, n):
    x, w, bias = _case(m, k, n, seed=1000 * m + k + n)
    _check_gemm(kb.gemm(x, kb.pack(w), bias), x, w, bias)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [1, 6, 40])
@pytest.mark.parametrize("k", [301, 576])  # 576: AMX tiles where the CPU has them
def test_gemm_bf16_in_out_threads_and_strided_rows(threads, m, k):
    x, w, _ = _case(m, k, 150, seed=m + threads + k)
    big = torch.zeros(m, k + 99, dtype=torch.bfloat16)
    big[:, 7:k + 7] = x.bfloat16()
    xs = big[:, 7:k + 7]  # rows of stride k + 99
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = kb.gemm(xs, kb.pack(w))
        y32 = kb.gemm(xs, kb.pack(w), out_dtype=torch.float32)
    finally:
        torch.set_num_threads(old)
    assert y.dtype == torch.bfloat16 and y32.dtype == torch.float32
    _check_gemm(y, x, w, None)
    _check_gemm(y32, x, w, None)


@pytest.mark.parametrize("k,n", [(576, 150), (1536, 67), (301, 40)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gemm_rows_do_not_depend_on_the_batch(k, n, out_dtype):
    """Each row's outputs, bias included, are the same bits whether it is computed alone or among
    M rows (on AMX the tiles' rows are configured per M: 16 + 16, a tail of 1..31)."""
    x, w, bias = _case(70, k, n, seed=k + n)
    p = kb.pack(w)
    alone = torch.cat([kb.gemm(x[i:i + 1], p, bias, out_dtype=out_dtype) for i in range(70)])
    for m in (2, 16, 17, 31, 32, 33, 64, 70):
        assert torch.equal(kb.gemm(x[:m], p, bias, out_dtype=out_dtype), alone[:m]), m
    _check_gemm(alone, x, w, bias)


def _amx_granted() -> bool:
    """Whether Linux lets this process use AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM), as the
    library asks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, XFEATURE_XTILEDATA


def test_amx_runs_where_the_cpu_and_linux_have_it():
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    if not {"amx_tile", "amx_bf16"} <= set(flags) or platform.machine() != "x86_64":
        pytest.skip("CPU without AMX bf16")
    if "-march=native" not in kb.detail():
        pytest.skip(f"not built for this CPU: {kb.detail()}")
    macros = subprocess.run([compiler(), "-march=native", "-dM", "-E", "-x", "c", "/dev/null"],
                            capture_output=True, text=True).stdout
    if "__AMX_BF16__" not in macros:
        pytest.skip("this compiler's -march=native does not enable AMX")
    assert kb.isa() == ("amx_bf16" if _amx_granted() else "avx512_bf16")


def test_gemm_rounds_activations_to_nearest_even():
    """float32 activations halfway between two bf16 values round to the even one (as torch)."""
    x = torch.tensor([[1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0]])
    w = torch.eye(4).bfloat16()
    y = kb.gemm(x, kb.pack(w))
    assert torch.equal(y, x.bfloat16().float())


def test_gemm_empty_batch():
    assert kb.gemm(torch.zeros(0, 8), kb.pack(torch.ones(3, 8))).shape == (0, 3)


def test_inputs_the_kernel_does_not_take_give_none():
    p = kb.pack(torch.randn(8, 16))
    assert kb.gemm(torch.randn(2, 16, dtype=torch.float16), p) is None
    assert kb.gemm(torch.randn(2, 15), p) is None  # wrong K
    assert kb.gemm(torch.randn(16, 2).t(), p) is None  # column-strided
    assert kb.gemm(torch.randn(2, 16), p, torch.randn(8, dtype=torch.bfloat16)) is None  # bias dtype
    assert kb.gemm(torch.randn(2, 16), p, torch.randn(7)) is None  # bias size
    assert kb.gemm(torch.empty(2, 16, device="meta"), p) is None


# -- the other ISA paths, compiled here with fewer flags -------------------------------------------

@pytest.fixture(scope="module")
def avx2_lib(tmp_path_factory, compile_bf16) -> ctypes.CDLL:
    lib = compile_bf16(tmp_path_factory, "avx2", ["-O3", "-mavx2", "-mfma", "-fopenmp"])
    assert lib.infer_bf16_isa() == 2
    return lib


@pytest.fixture(scope="module")
def portable_lib(tmp_path_factory, compile_bf16) -> ctypes.CDLL:
    lib = compile_bf16(tmp_path_factory, "portable", ["-O2"])
    assert lib.infer_bf16_isa() == 0
    return lib


def _gemm_with(lib: ctypes.CDLL, x: torch.Tensor, p: kb.PackedBF16, bias: torch.Tensor | None,
               out_dtype: torch.dtype) -> torch.Tensor:
    lib.infer_bf16_set_threads(2)
    y = torch.empty(x.shape[0], p.out_features, dtype=out_dtype)
    lib.infer_bf16_gemm(x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0), x.shape[0],
                        p.in_features, p.data.data_ptr(),
                        bias.data_ptr() if bias is not None else None, p.out_features,
                        y.data_ptr(), int(out_dtype == torch.bfloat16), p.out_features)
    return y


@pytest.mark.skipif("avx2" not in open("/proc/cpuinfo").read(), reason="CPU without AVX2")
@pytest.mark.parametrize("m", [1, 3, 4, 9])
@pytest.mark.parametrize("k,n", [(576, 67), (37, 16), (1, 5)])
def test_avx2_path(avx2_lib, m, k, n):
    x, w, bias = _case(m, k, n, seed=7 * m + k)
    _check_gemm(_gemm_with(avx2_lib, x, kb.pack(w), bias, torch.float32), x, w, bias)
    _check_gemm(_gemm_with(avx2_lib, x.bfloat16(), kb.pack(w), None, torch.bfloat16), x, w, None)


@pytest.mark.parametrize("m", [1, 4, 9, 33])
@pytest.mark.parametrize("k,n", [(576, 67), (37, 16)])
def test_avx512_bf16_path(avx512_lib, m, k, n):
    x, w, bias = _case(m, k, n, seed=13 * m + k)
    _check_gemm(_gemm_with(avx512_lib, x, kb.pack(w), bias, torch.float32), x, w, bias)
    _check_gemm(_gemm_with(avx512_lib, x.bfloat16(), kb.pack(w), None, torch.bfloat16), x, w, None)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("k,n", [(63, 33), (2, 17)])
def test_portable_c_path(portable_lib, m, k, n):
    x, w, bias = _case(m, k, n, seed=11 * m + k)
    _check_gemm(_gemm_with(portable_lib, x, kb.pack(w), bias, torch.float32), x, w, bias)
    _check_gemm(_gemm_with(portable_lib, x.bfloat16(), kb.pack(w), None, torch.bfloat16), x, w,
                None)


# -- the layer ops of bf16 models: rounded where the torch references round ----------------------

def _assert_bf16_match(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same rounding points as the reference: at most one bf16 ulp apart (exp / rsqrt may
    differ in float32's last bit), and at least 99 % of the elements bit for bit (a missing or
    extra rounding step changes far more)."""
    ia, ib = got.view(torch.int16).int(), want.view(torch.int16).int()
    assert int((ia - ib).abs().max()) <= 1
    assert (ia == ib).float().mean().item() >= 0.99


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.bfloat16),
                                             (torch.float32, torch.bfloat16),
                                             (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dim", [77, 576])  # 576: the 16-lane path of bf16 rows and weight
def test_rms_norm_mixed_dtypes(x_dtype, w_dtype, with_residual, dim):
    g = _gen(3)
    big = torch.randn(9, dim + 23, generator=g) * 3
    x = big[:, :dim].to(x_dtype)  # strided rows for the bf16 case
    if x_dtype == torch.float32:
        x = big[:, :dim].clone()
    w = torch.randn(dim, generator=g).to(w_dtype)
    res = (torch.randn(9, dim, generator=g) * 2).to(x_dtype) if with_residual else None
    out, new_res = kb.rms_norm(x, w, 1e-5, res)
    want, want_res = rms_norm_ref(x, w, 1e-5, res)
    assert out.dtype == want.dtype and out.shape == want.shape
    if out.dtype == torch.bfloat16:  # the same rounding points: at most one ulp (rsqrt order)
        _assert_bf16_match(out, want)
    elif x_dtype == torch.bfloat16:  # float32 w times the bf16-rounded normed x: one ulp of it
        torch.testing.assert_close(out, want, rtol=2 ** -7, atol=1e-6)
    else:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    if with_residual:
        assert torch.equal(new_res, want_res)
    else:
        assert new_res is None


@pytest.mark.parametrize("threads", [1, 2])
def test_rms_norm_and_rope_split_across_threads(threads):
    """Sizes above the kernels' threshold: rows go to the work pool in 16-row units (a tail)."""
    g = _gen(8)
    x = (torch.randn(203, 577, generator=g) * 3).bfloat16()
    res = torch.randn(203, 577, generator=g).bfloat16()
    w = torch.randn(577, generator=g).bfloat16()
    qkv = torch.randn(301, (8 + 2 * 4) * 32, generator=g).bfloat16()
    q, k = qkv[:, :256].view(301, 8, 32), qkv[:, 256:384].view(301, 4, 32)
    cos_sin = rope_table(32, 512, {"rope_theta": 10000.0})
    pos = torch.randint(0, 512, (301,), generator=g)
    want_q, want_k = rotary_ref(pos, q.clone(), k.clone(), cos_sin, 32)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, new_res = kb.rms_norm(x, w, 1e-5, res)
        kb.rope_(pos, q, k, cos_sin, 32)
    finally:
        torch.set_num_threads(old)
    want, want_res = rms_norm_ref(x, w, 1e-5, res)
    _assert_bf16_match(out, want)
    assert torch.equal(new_res, want_res)
    _assert_bf16_match(q, want_q)
    _assert_bf16_match(k, want_k)


@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rope_bf16_in_place_on_qkv_views(rotary_dim):
    g = _gen(5)
    qkv = torch.randn(6, (4 + 2 * 2) * 16, generator=g).bfloat16()
    q, k = qkv[:, :64].view(6, 4, 16), qkv[:, 64:96].view(6, 2, 16)  # row stride 128
    cos_sin = rope_table(rotary_dim, 128, {"rope_theta": 10000.0})
    pos = torch.tensor([0, 1, 7, 30, 64, 127])
    want_q, want_k = rotary_ref(pos, q.clone(), k.clone(), cos_sin, rotary_dim)
    before_v = qkv[:, 96:].clone()
    got_q, got_k = kb.rope_(pos, q, k, cos_sin, rotary_dim)
    assert got_q.data_ptr() == q.data_ptr()  # in place
    _assert_bf16_match(got_q, want_q)
    _assert_bf16_match(got_k, want_k)
    assert torch.equal(qkv[:, 96:], before_v)  # v untouched


@pytest.mark.parametrize("t,i", [(16, 45), (100, 768)])  # the second is split across threads
def test_silu_mul_bf16(t, i):
    x = (torch.randn(t, 2 * i, generator=_gen(6)) * 4).bfloat16()
    _assert_bf16_match(kb.silu_mul(x), silu_and_mul_ref(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 7), (3, 576), (512, 576), (70, 1000)])  # tails, several units
@pytest.mark.parametrize("threads", [1, 2])
def test_residual_add_is_torchs_add(dtype, shape, threads):
    g = _gen(11)
    h, x = (torch.randn(*shape, generator=g) * 8).to(dtype), torch.randn(*shape, generator=g).to(dtype)
    h[0, 0], x[0, 0] = float("nan"), 1.0  # NaN stays NaN
    kb.set_call_threads(threads)
    try:
        out = kb.residual_add(h, x)
    finally:
        kb.set_call_threads(0)
    assert out.dtype == dtype and out.shape == h.shape
    want = h + x
    assert torch.equal(out.view(-1)[1:], want.view(-1)[1:])  # the same bits as torch's add
    assert out[0, 0].isnan()


def test_layer_ops_decline_what_they_do_not_take():
    assert kb.residual_add(torch.randn(2, 8), torch.randn(2, 8).bfloat16()) is None  # mixed dtypes
    assert kb.residual_add(torch.randn(8, 2).t(), torch.randn(2, 8)) is None  # not contiguous
    assert kb.residual_add(torch.randn(2, 8).half(), torch.randn(2, 8).half()) is None
    h = torch.randn(2, 8, dtype=torch.float16)
    assert kb.rms_norm(h, torch.ones(8, dtype=torch.float16), 1e-6) is None
    assert kb.rms_norm(torch.randn(2, 8).bfloat16(), torch.ones(7), 1e-6) is None  # weight size
    assert kb.silu_mul(torch.randn(3, 7).bfloat16()) is None  # odd width
    q = torch.randn(2, 4, 8).bfloat16()
    cs = rope_table(8, 4, {"rope_theta": 10000.0})
    assert kb.rope_(torch.tensor([0, 1]), q, q[:, :2], cs, 6) is None  # table width != rotary_dim
    assert kb.rope_(torch.tensor([0, 1], dtype=torch.int32), q, q[:, :2], cs, 8) is None


# -- prefill / extend / decode attention over a paged bf16 cache ---------------------------------

def _attention_inputs(seqs: list[tuple[int, int]], heads: int, kv_heads: int, d: int, page: int,
                      seed: int):
    from infer.core.testing.batches import make_batch

    g = _gen(seed)
    batch = make_batch(seqs, page, torch.device("cpu"), g)
    t = batch.meta.num_tokens
    shape = (batch.num_pages, page, kv_heads, d)
    kc, vc = torch.randn(shape, generator=g).bfloat16(), torch.randn(shape, generator=g).bfloat16()
    # q, k, v as views of one packed qkv row (the model's layout: row stride > heads * d)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).bfloat16()
    q = qkv[:, :heads * d].view(t, heads, d)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].view(t, kv_heads, d)
    return batch, q, k, v, kc, vc


def _attention_want(batch, q, kc, vc, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention of every query row over the (already written) caches: the output and
    sum_j p_j |v_j| per element (the scale of the kernel's bf16 rounding of p and of the out)."""
    meta, (_, page, hkv, d) = batch.meta, kc.shape
    g = q.shape[1] // hkv
    out = torch.empty(q.shape, dtype=torch.float64)
    mag = torch.empty(q.shape, dtype=torch.float64)
    row = 0
    for i, (n, ext) in enumerate(zip(meta.seq_lens_cpu, meta.extend_lens_cpu, strict=True)):
        pages = meta.block_tables[i, :-(-n // page)].long()
        ks = kc[pages].reshape(-1, hkv, d)[:n].double().repeat_interleave(g, 1)  # [n, H, d]
        vs = vc[pages].reshape(-1, hkv, d)[:n].double().repeat_interleave(g, 1)
        for t in range(ext):
            seen = n - ext + t + 1
            s = torch.einsum("hd,jhd->hj", q[row].double(), ks[:seen]) * scale
            p = torch.softmax(s, -1)
            out[row] = torch.einsum("hj,jhd->hd", p, vs[:seen])
            mag[row] = torch.einsum("hj,jhd->hd", p, vs[:seen].abs())
            row += 1
    return out, mag


def _run_attention(lib: ctypes.CDLL | None, batch, q, k, v, kc, vc, scale: float) -> torch.Tensor:
    meta = batch.meta
    ext = torch.tensor(meta.extend_lens_cpu, dtype=torch.int32)
    if lib is None:
        out = kb.paged_attention(q, k, v, kc, vc, meta.slot_mapping, meta.block_tables,
                                 meta.seq_lens, ext, meta.page_size, scale)
        assert out is not None
        return out
    lib.infer_bf16_set_threads(2)
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    bt = meta.block_tables
    lib.infer_bf16_prefill_attention(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0),
                                     v.data_ptr(), v.stride(0), kc.data_ptr(), vc.data_ptr(),
                                     meta.slot_mapping.data_ptr(), q.shape[0], bt.data_ptr(),
                                     bt.stride(0), meta.seq_lens.data_ptr(), ext.data_ptr(),
                                     meta.num_seqs, q.shape[1], k.shape[1], q.shape[2],
                                     meta.page_size, scale, out.data_ptr())
    return out


def _check_attention(seqs, heads, kv_heads, d, page, seed, lib=None, threads=2) -> None:
    from infer.core.ops.attention import AttentionConfig, write_kv
    from infer.core.ops.reference.attention import TorchNativeAttention as Reference
    from infer.core.testing.batches import rel_err

    batch, q, k, v, kc, vc = _attention_inputs(seqs, heads, kv_heads, d, page, seed)
    scale = 1.0 / (d ** 0.5) * 1.3  # not the default scale: a kernel ignoring it fails
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv(k, v, kc_ref, vc_ref, batch.meta.slot_mapping)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = _run_attention(lib, batch, q, k, v, kc, vc, scale)
    finally:
        torch.set_num_threads(old)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)  # the new k/v, nothing else
    want, mag = _attention_want(batch, q, kc_ref, vc_ref, scale)
    # probabilities rounded to bf16 (2^-8 relative each), the output too (2^-8 of |out|)
    bound = 2.0 ** -8 * (mag + want.abs()) + 1e-6
    err = (out.double() - want).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3e}"
    # and against the core's plain-torch backend (SDPA on the bf16 cache)
    cfg = AttentionConfig(num_heads=heads, num_kv_heads=kv_heads, head_dim=d, scale=scale,
                          page_size=page, dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                          device=torch.device("cpu"), num_layers=1)
    ref = Reference(cfg)
    ref.plan(batch.meta)
    kc2, vc2 = kc_ref.clone(), vc_ref.clone()
    assert rel_err(out, ref.forward(q, k, v, kc2, vc2, 0)) < 1e-2


ATTN_SEQS = {
    "prefill": [(0, 17), (0, 5), (0, 33)],
    "long_prefill_blocks": [(0, 100), (0, 64), (0, 1)],  # several 32-row query blocks, tails
    "extend_over_prefix": [(12, 9), (40, 23), (3, 1), (37, 70)],
    "decode": [(30, 1), (7, 1), (64, 1), (0, 1), (19, 1)],
    "mixed": [(0, 9), (12, 1), (5, 4), (33, 1), (0, 1), (70, 16)],
}


@pytest.mark.parametrize("name", list(ATTN_SEQS))
@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 16), (6, 1, 7)])
def test_paged_attention_against_float64_and_the_reference(name, page, heads, kv_heads, d):
    _check_attention(ATTN_SEQS[name], heads, kv_heads, d, page, seed=hash((name, page, d)) % 1000)


@pytest.mark.parametrize("threads", [1, 2])
def test_paged_attention_threads(threads):
    _check_attention(ATTN_SEQS["extend_over_prefix"], 8, 2, 32, 4, seed=5, threads=threads)


@pytest.mark.skipif("avx2" not in open("/proc/cpuinfo").read(), reason="CPU without AVX2")
@pytest.mark.parametrize("name", ["long_prefill_blocks", "mixed"])
def test_paged_attention_avx2_path(avx2_lib, name):
    _check_attention(ATTN_SEQS[name], 6, 2, 24, 4, seed=3, lib=avx2_lib)


def test_paged_attention_portable_c_path(portable_lib):
    _check_attention(ATTN_SEQS["extend_over_prefix"], 4, 2, 15, 4, seed=4, lib=portable_lib)


def test_paged_attention_declines_what_it_does_not_take():
    batch, q, k, v, kc, vc = _attention_inputs([(3, 5)], 4, 2, 16, 4, seed=1)
    meta = batch.meta
    ext = torch.tensor(meta.extend_lens_cpu, dtype=torch.int32)

    def call(**kw):
        args = dict(q=q, k=k, v=v, k_cache=kc, v_cache=vc, slots=meta.slot_mapping,
                    block_tables=meta.block_tables, seq_lens=meta.seq_lens, ext_lens=ext,
                    page_size=4, scale=0.25)
        args.update(kw)
        return kb.paged_attention(**args)

    assert call() is not None
    assert call(k_cache=kc.float(), v_cache=vc.float()) is None  # a float32 cache
    assert call(q=q.float()) is None
    assert call(ext_lens=ext + 1) is None  # rows do not add up to T
    assert call(seq_lens=meta.seq_lens - 6) is None  # fewer keys than new rows
    assert call(slots=meta.slot_mapping.int()) is None
    assert call(q=q[:, :3]) is None  # 3 query heads do not group over 2 KV heads


def test_cpu_backend_runs_the_kernel_and_picks_threads_per_step(monkeypatch):
    """The CPU attention backend on a bf16 cache: each step's output is the kernel's (the same
    bits on 1 and 2 threads: a unit's arithmetic does not depend on who runs it), and the step's
    thread count is measured (1 first, then 2) before the faster one is kept."""
    from infer.core.ops.attention import AttentionConfig
    from infer_cpu.ops.attention import TorchNativeAttention

    monkeypatch.delenv("INFER_CPU_BF16_PREFILL_THREADS", raising=False)
    batch, q, k, v, kc, vc = _attention_inputs(ATTN_SEQS["extend_over_prefix"], 6, 2, 32, 4, 9)
    cfg = AttentionConfig(num_heads=6, num_kv_heads=2, head_dim=32, scale=0.2, page_size=4,
                          dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                          device=torch.device("cpu"), num_layers=2)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        backend = TorchNativeAttention(cfg)
        outs, picked = [], []
        for _ in range(3):
            backend.plan(batch.meta)
            picked.append(kb._call_threads[0])
            for layer in range(2):
                outs.append(backend.forward(q, k, v, kc.clone(), vc.clone(), layer))
    finally:
        torch.set_num_threads(old)
        kb.set_call_threads(0)
    assert picked[:2] == [1, 2] and picked[2] in (1, 2)
    want = _run_attention(None, batch, q, k, v, kc.clone(), vc.clone(), 0.2)
    assert all(torch.equal(o, want) for o in outs)
