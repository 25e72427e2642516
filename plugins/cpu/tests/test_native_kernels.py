"""The native CPU kernels (infer_cpu.kernels) against the plain-torch references, on fresh
random inputs, plus the fall-back contract: an input a kernel does not take gives None."""

from __future__ import annotations

import ctypes

import gguf
import pytest
import torch
import torch.nn.functional as F
from infer.core.ops import layer_ops as ref
from infer_cpu import kernels
from infer_cpu.quant.packing import Q, QWeight, gguf_qweight, quantize_q8_blocks

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason=f"native kernels unavailable: {kernels.status().detail}")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _gguf(n: int, k: int, qtype: Q, seed: int) -> tuple[torch.Tensor, QWeight]:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    raw = gguf.quants.quantize(w.numpy(), qtype)
    exact = torch.from_numpy(gguf.quants.dequantize(raw, qtype)).reshape(n, k)
    return exact, gguf_qweight(torch.from_numpy(raw), qtype, n)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_gguf_blocks_dequantize_exactly(qtype):
    exact, qw = _gguf(40, 96, qtype, seed=1)
    torch.testing.assert_close(qw.dequantize(), exact, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize("m", [1, 3, 17, 40])
@pytest.mark.parametrize("threads", [1, 2])
def test_qgemm_against_dequantised_matmul(qtype, m, threads):
    n = 37  # not a multiple of the kernel's 4/16-row tiles
    exact, qw = _gguf(n, 128, qtype, seed=m)
    x = torch.randn(m, 128)
    bias = torch.randn(n)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = kernels.qgemm(x, qw, bias)
    finally:
        torch.set_num_threads(old)
    # int8 activations per 32-block: about 0.5 % relative error on random data
    assert _rel(y, F.linear(x, exact, bias)) < 2e-2


def _int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> the activations the q8 kernels multiply, dequantised: per 32-block d = amax / 127
    and codes round(x * (1 / d)) (half to even, as nearbyintf), in float32 as the C code computes
    them. A reference on these differs from the kernels only in the order of the float sums."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    return (torch.round(xb * inv) * d).reshape(m, k)


def _tile_case(m: int, k: int, qtype: Q) -> tuple[torch.Tensor, QWeight, torch.Tensor, torch.Tensor]:
    n = 37  # 16-row chunks 16 + 16 + 5: one full 4-row tile and a 1-row remainder at the end
    exact, qw = _gguf(n, k, qtype, seed=1000 * m + k)
    g = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 8  # row scales differ
    x[0, :32] = 0  # a zero block: scale 0
    bias = torch.randn(n, generator=g)
    want = F.linear(_int8_activations(x).double(), exact.double(), bias.double())
    return x, qw, bias, want


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 17, 32])
@pytest.mark.parametrize("k", [64, 160, 576])
def test_qgemm_tiles_against_int8_activation_reference(qtype, m, k):
    """Every activation-row tile size (1-4 rows and their remainders) and weight-row remainder,
    on one and two threads, to float rounding of a reference with the same int8 activations."""
    x, qw, bias, want = _tile_case(m, k, qtype)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = kernels.qgemm(x, qw, bias)
            assert _rel(y, want) < 1e-5, (threads, _rel(y, want))
    finally:
        torch.set_num_threads(old)


@pytest.fixture(scope="module")
def portable_lib(tmp_path_factory, compile_kernels) -> ctypes.CDLL:
    """The kernels compiled without AVX2 or F16C: the portable C paths."""
    lib = compile_kernels(tmp_path_factory, "portable", ["-O2", "-U__AVX2__", "-U__F16C__"])
    assert lib.infer_kernels_isa() == 0
    return lib


@pytest.fixture(scope="module")
def tiles256_lib(tmp_path_factory, compile_kernels) -> ctypes.CDLL:
    """The machine's own build with the decode attention's 256-bit register tiles
    (``-DINFER_ATTN_TILES_256``) where it would use the AVX-512 ones."""
    if "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("needs AVX-512")
    lib = compile_kernels(tmp_path_factory, "tiles256", ["-O3", "-march=native", "-fopenmp",
                                                         "-DINFER_ATTN_TILES_256"])
    lib.infer_set_threads(1)
    return lib


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize("m", [1, 5])
def test_qgemm_portable_c_against_int8_activation_reference(portable_lib, qtype, m):
    x, qw, bias, want = _tile_case(m, 160, qtype)
    y = torch.empty_like(want, dtype=torch.float32)
    portable_lib.infer_qgemm(qw.kind, x.data_ptr(), x.stride(0), m, qw.in_features, 0,
                             qw.blocks.data_ptr(), bias.data_ptr(), qw.out_features, y.data_ptr(),
                             qw.out_features)
    assert _rel(y, want) < 1e-5


def test_qgemm_strided_rows_and_fused_silu_mul():
    exact, qw = _gguf(24, 64, Q.Q4_1, seed=5)
    big = torch.randn(5, 200)
    x = big[:, 10:74]  # rows with stride 200
    assert _rel(kernels.qgemm(x, qw), x @ exact.t()) < 2e-2
    gu = torch.randn(4, 128)
    y = kernels.qgemm(gu, qw, silu_mul=True)
    assert _rel(y, ref.silu_and_mul_ref(gu) @ exact.t()) < 2e-2


@pytest.mark.parametrize("m", [1, 2, 19])
def test_fgemm_q8_float_activations(m):
    w = torch.randn(50, 96)
    qw = quantize_q8_blocks(w)
    x = torch.randn(m, 96)
    assert _rel(kernels.fgemm(x, qw), x @ qw.dequantize().t()) < 1e-5
    assert _rel(qw.dequantize(), w) < 1e-2


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 17, 32, 67])
@pytest.mark.parametrize("n", [1, 3, 37, 50])
@pytest.mark.parametrize("threads", [1, 2])
def test_fgemm_tiles_every_element(qtype, m, n, threads):
    """Every activation-row remainder of the 4-row tile and of the 64-row block, weight-row
    remainders of the 1-, 2- and 4-row tiles (N odd, N < 4), one and two threads, strided
    activation rows, a bias: each output to float rounding of a float64 reference on the exact
    dequantised weights (a wrong or missing element fails the max check)."""
    g = torch.Generator().manual_seed(31 * m + n)
    exact, qw = _gguf(n, 160, qtype, seed=31 * m + n)
    big = torch.randn(m, 200, generator=g) * torch.rand(m, 1, generator=g) * 4
    x = big[:, 20:180]  # rows of stride 200
    bias = torch.randn(n, generator=g)
    want = x.double() @ exact.double().t() + bias.double()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = kernels.fgemm(x, qw, bias)
    finally:
        torch.set_num_threads(old)
    scale = x.double().abs() @ exact.double().abs().t() + bias.double().abs()
    err = (y.double() - want).abs() / scale
    assert err.max().item() < 1e-6, err.max().item()


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(with_residual):
    x, w = torch.randn(6, 80), torch.randn(80)
    res = torch.randn(6, 80) if with_residual else None
    out, new_res = kernels.rms_norm(x, w, 1e-5, res)
    r_out, r_res = ref.rms_norm_ref(x, w, 1e-5, res)
    torch.testing.assert_close(out, r_out)
    if with_residual:
        torch.testing.assert_close(new_res, r_res)
    else:
        assert new_res is None


@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rope_in_place_on_qkv_views(rotary_dim):
    from infer.core.model.layers.rotary import rope_table

    t, h, hkv, d = 7, 4, 2, 32
    qkv = torch.randn(t, (h + 2 * hkv) * d)
    q = qkv[:, :h * d].view(t, h, d)
    k = qkv[:, h * d:(h + hkv) * d].view(t, hkv, d)
    pos = torch.randint(0, 64, (t,))
    table = rope_table(rotary_dim, 64, {"rope_theta": 10000.0})
    rq, rk = ref.rotary_ref(pos, q.clone(), k.clone(), table, rotary_dim)
    v_before = qkv[:, (h + hkv) * d:].clone()
    assert kernels.rope_(pos, q, k, table, rotary_dim)
    torch.testing.assert_close(q, rq)
    torch.testing.assert_close(k, rk)
    torch.testing.assert_close(qkv[:, (h + hkv) * d:], v_before)  # v untouched


def test_silu_mul():
    x = torch.randn(5, 48)
    torch.testing.assert_close(kernels.silu_mul(x), ref.silu_and_mul_ref(x))


def _paged_case(seq_lens: list[int], h: int, hkv: int, d: int, page: int, seed: int = 0):
    """Scattered pages for each sequence, random caches and a fused qkv whose q/k/v views the
    kernel reads; slots are where each sequence's newest token goes."""
    g = torch.Generator().manual_seed(seed)
    b = len(seq_lens)
    pages_needed = [-(-s // page) for s in seq_lens]
    n_pages = sum(pages_needed) + 2
    perm = torch.randperm(n_pages, generator=g)  # sequences own scattered pages
    tables = torch.zeros(b, max(pages_needed) + 1, dtype=torch.int32)  # wider than needed
    at = 0
    for i, p in enumerate(pages_needed):
        tables[i, :p] = perm[at:at + p].to(torch.int32)
        at += p
    k_cache = torch.randn(n_pages, page, hkv, d, generator=g)
    v_cache = torch.randn(n_pages, page, hkv, d, generator=g)
    slots = torch.tensor([int(tables[i, (s - 1) // page]) * page + (s - 1) % page
                          for i, s in enumerate(seq_lens)], dtype=torch.int64)
    qkv = torch.randn(b, (h + 2 * hkv) * d + 8, generator=g) * 2  # rows wider than q|k|v
    q = qkv[:, :h * d].view(b, h, d)
    k = qkv[:, h * d:(h + hkv) * d].view(b, hkv, d)
    v = qkv[:, (h + hkv) * d:(h + 2 * hkv) * d].view(b, hkv, d)
    return q, k, v, k_cache, v_cache, slots, tables


def _paged_reference(q, k, kc, vc, slots, tables, seq_lens, page):
    """sdpa over each sequence's gathered keys/values (after the kernel wrote the new ones)."""
    b, h, d = q.shape
    hkv = kc.shape[2]
    out = torch.empty(b, h, d)
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    for i, s in enumerate(seq_lens):
        torch.testing.assert_close(flat_k[slots[i]], k[i])  # the new key was written
        idx = torch.tensor([int(tables[i, j // page]) * page + j % page for j in range(s)])
        ks = flat_k[idx].transpose(0, 1).double()  # [Hkv, S, D]
        vs = flat_v[idx].transpose(0, 1).double()
        out[i] = F.scaled_dot_product_attention(q[i][:, None, :].double(), ks, vs,
                                                scale=d ** -0.5, enable_gqa=True)[:, 0, :].float()
    return out


def _lib_paged_decode(lib, q, k, v, k_cache, v_cache, slots, tables, seq_lens, page):
    """``infer_paged_decode`` of another build of the kernels (it writes the new k/v)."""
    out, lens = torch.empty(q.shape), torch.tensor(seq_lens, dtype=torch.int32)
    lib.infer_paged_decode(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(),
                           v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                           tables.data_ptr(), tables.stride(0), lens.data_ptr(), out.data_ptr(),
                           q.shape[0], q.shape[1], k.shape[1], q.shape[2], page, q.shape[2] ** -0.5,
                           kernels.KV_CODES[k_cache.dtype])
    return out


def _paged_decode(q, k, v, k_cache, v_cache, slots, tables, seq_lens, page, threads=None):
    old = torch.get_num_threads()
    torch.set_num_threads(threads or old)
    try:
        return kernels.paged_decode(q, k, v, k_cache, v_cache, slots, tables,
                                    torch.tensor(seq_lens, dtype=torch.int32), page,
                                    q.shape[2] ** -0.5)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("page", [1, 4, 16])
def test_paged_decode_against_sdpa(page):
    seq_lens = [5, 1, 23]
    case = _paged_case(seq_lens, 6, 2, 16, page)  # head dim 16: the portable path
    kc, vc = case[3].clone(), case[4].clone()
    out = _paged_decode(*case[:3], kc, vc, *case[5:], seq_lens, page)
    want = _paged_reference(case[0], case[1], kc, vc, case[5], case[6], seq_lens, page)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("h", "hkv", "d"), [(9, 3, 64), (4, 4, 32), (4, 2, 64), (8, 2, 32),
                                             (10, 2, 64), (8, 1, 128)])
@pytest.mark.parametrize("seq_lens", [[1], [7, 130], [192, 1, 3, 66, 5, 200, 33, 257]])
@pytest.mark.parametrize("page", [1, 5, 16])
@pytest.mark.parametrize("threads", [1, 2])
def test_paged_decode_gqa_groups_against_sdpa(h, hkv, d, seq_lens, page, threads):
    """The register-tiled path (head dim a multiple of 32): query-head groups of 1-8 per KV
    head (tiles of up to 3 heads and their remainders), key counts around the 4-key tile,
    partial last pages, batches split across one and two threads."""
    case = _paged_case(seq_lens, h, hkv, d, page, seed=len(seq_lens) * 100 + page)
    kc, vc = case[3].clone(), case[4].clone()
    out = _paged_decode(*case[:3], kc, vc, *case[5:], seq_lens, page, threads)
    want = _paged_reference(case[0], case[1], kc, vc, case[5], case[6], seq_lens, page)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize(("h", "hkv", "d"), [(9, 3, 64), (8, 2, 32), (16, 4, 128)])
@pytest.mark.parametrize("page", [1, 16])
def test_paged_decode_row_bits_do_not_depend_on_batch_or_threads(h, hkv, d, page):
    """Each sequence's output is the same bits alone or beside others, on 1, 2 or 3 threads: the
    kernel processes a sequence's KV heads together, or some of them when the thread split cuts
    the sequence, and a query head's arithmetic must not depend on which."""
    seq_lens = [70, 17, 130, 1, 48]
    q, k, v, kc, vc, slots, tables = _paged_case(seq_lens, h, hkv, d, page, seed=h + page)
    batch = {t: _paged_decode(q, k, v, kc.clone(), vc.clone(), slots, tables, seq_lens, page, t)
             for t in (1, 2, 3)}
    for t in (2, 3):
        assert torch.equal(batch[t], batch[1]), t
    for i, n in enumerate(seq_lens):
        one = slice(i, i + 1)
        for t in (1, 2, 3):
            alone = _paged_decode(q[one], k[one], v[one], kc.clone(), vc.clone(), slots[one],
                                  tables[one], [n], page, t)
            assert torch.equal(alone[0], batch[1][i]), (i, t)


# float32 bits on and beside the rounding ties of each 16-bit cache type: a tie with an even and
# with an odd upper part, just above and just below a tie, a negative tie; fp16 also subnormal
# ties (24.5 and 25.5 x 2^-24) and a value that rounds down to its largest finite number. Truncation, ties-away or a flush
# of subnormals would write other bits than torch's conversion.
KV16_TIES = {
    torch.bfloat16: [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF, -0x40818000],
    torch.float16: [0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF, -0x40803000,
                    0x35C40000, 0x35CC0000, 0x477FEFFF],
}


def _kv16_case(seq_lens: list[int], h: int, hkv: int, d: int, page: int, seed: int = 0,
               dtype: torch.dtype = torch.bfloat16):
    """_paged_case with 16-bit caches of ``dtype``, and new keys / values whose first (last)
    values are KV16_TIES."""
    q, k, v, kc, vc, slots, tables = _paged_case(seq_lens, h, hkv, d, page, seed=seed)
    ties = torch.tensor(KV16_TIES[dtype], dtype=torch.int32).view(torch.float32)
    k[0, 0, :len(ties)] = ties
    v[-1, -1, -len(ties):] = -ties
    return q, k, v, kc.to(dtype), vc.to(dtype), slots, tables


def _check_kv16_writes(k, v, kc, vc, slots):
    """The new rows are torch's float -> bfloat16 / float16 conversion of k / v, bit for bit."""
    hkv, d = kc.shape[2], kc.shape[3]
    for new, cache in ((k, kc), (v, vc)):
        got = cache.view(-1, hkv, d)[slots].view(torch.int16)
        assert torch.equal(got, new.to(cache.dtype).view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("h", "hkv", "d"), [(9, 3, 64), (8, 2, 32), (10, 2, 64), (6, 2, 16)])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("threads", [1, 2])
def test_paged_decode_over_a_16_bit_cache(h, hkv, d, page, threads, dtype):
    """A float32 model's bf16 cache (--kv-cache-dtype bf16) or fp16 one (a GGUF file's default):
    the new keys and values rounded to nearest even as written, the attention over the cache's
    values exactly as stored (head dim 16: the portable path inside the AVX2 build)."""
    seq_lens = [192, 1, 3, 66, 257]
    q, k, v, kc, vc, slots, tables = _kv16_case(seq_lens, h, hkv, d, page, seed=page + d,
                                                dtype=dtype)
    out = _paged_decode(q, k, v, kc, vc, slots, tables, seq_lens, page, threads)
    _check_kv16_writes(k, v, kc, vc, slots)
    want = _paged_reference(q, k.to(dtype).float(), kc.float(), vc.float(), slots,
                            tables, seq_lens, page)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_paged_decode_portable_c_against_sdpa(portable_lib, dtype):
    """The portable C path over a float32 cache and over bf16 and fp16 ones."""
    seq_lens = [9, 1, 40]
    kv16 = kernels.KV_CODES[dtype]
    q, k, v, kc, vc, slots, tables = (
        _kv16_case(seq_lens, 9, 3, 64, 4, seed=3, dtype=dtype) if kv16
        else _paged_case(seq_lens, 9, 3, 64, 4, seed=3))
    out = _lib_paged_decode(portable_lib, q, k, v, kc, vc, slots, tables, seq_lens, 4)
    if kv16:
        _check_kv16_writes(k, v, kc, vc, slots)
        k = k.to(dtype).float()
    want = _paged_reference(q, k, kc.float(), vc.float(), slots, tables, seq_lens, 4)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_avx512_attention_tiles_give_the_256_bit_tiles_bits(tiles256_lib, dtype):
    """The decode attention's AVX-512 register tiles (two keys' 8-lane sums a register for the
    scores, 16 columns a register for the values) give the 256-bit tiles' bits, the rest of the
    build being the same: query-head groups of 1 to 8 per KV head (tiles of 3 heads and their
    remainders), head dims 32 to 128 (the value tile's 64 columns and a 32-column remainder), key
    counts around the 4-key tiles and the 4- and 16-position blocks, pages of 1, 5 and 16."""
    for h, hkv, d in [(9, 3, 64), (4, 4, 32), (8, 2, 96), (10, 2, 64), (8, 1, 128), (7, 1, 64)]:
        for seq_lens in ([1, 2, 3], [7, 130, 17], [192, 4, 66, 5, 200, 33, 257, 16]):
            for page in (1, 5, 16):
                q, k, v, kc, vc, slots, tables = _paged_case(seq_lens, h, hkv, d, page,
                                                             seed=h * d + page)
                kc, vc = kc.to(dtype), vc.to(dtype)
                got = _paged_decode(q, k, v, kc.clone(), vc.clone(), slots, tables, seq_lens,
                                    page, threads=1)
                want = _lib_paged_decode(tiles256_lib, q, k, v, kc.clone(), vc.clone(), slots,
                                         tables, seq_lens, page)
                assert torch.equal(got, want), (h, hkv, d, seq_lens, page)


def test_paged_decode_long_sequence_heap_scratch():
    """More positions than the kernel's stack scratch (2048 offsets, 3 x 2048 scores)."""
    seq_lens = [2500, 40]
    case = _paged_case(seq_lens, 9, 3, 64, 16, seed=7)
    kc, vc = case[3].clone(), case[4].clone()
    out = _paged_decode(*case[:3], kc, vc, *case[5:], seq_lens, 16)
    want = _paged_reference(case[0], case[1], kc, vc, case[5], case[6], seq_lens, 16)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6)


def test_inputs_the_kernels_do_not_take_give_none():
    qw = quantize_q8_blocks(torch.randn(8, 64))
    assert kernels.qgemm(torch.randn(2, 64, dtype=torch.bfloat16), qw) is None
    assert kernels.qgemm(torch.randn(2, 32), qw) is None  # wrong K
    assert kernels.rms_norm(torch.randn(2, 3, 8), torch.ones(8), 1e-6) is None  # 3-D
    assert kernels.silu_mul(torch.randn(4, 8).t()) is None  # column-strided
    q = torch.randn(2, 4, 8, dtype=torch.float64)
    assert not kernels.rope_(torch.zeros(2, dtype=torch.int64), q, q, torch.randn(4, 8), 8)


def test_tensors_off_the_cpu_give_none():
    """The torch_native backend also runs as the reference on CUDA: tensors on another device
    must take the torch path, never reach the C kernels (which read host memory)."""
    m = torch.device("meta")
    x, w = torch.empty(2, 8, device=m), torch.empty(8, device=m)
    assert kernels.rms_norm(x, w, 1e-6) is None
    assert kernels.rms_norm(torch.randn(2, 8), w, 1e-6) is None  # weight elsewhere
    assert kernels.silu_mul(torch.empty(2, 8, device=m)) is None
    q, k = torch.empty(2, 4, 8, device=m), torch.empty(2, 2, 8, device=m)
    pos = torch.zeros(2, dtype=torch.int64)
    assert kernels.rope_(pos, q, k, torch.randn(16, 8), 8) is None
    assert kernels.rope_(pos.to(m), torch.randn(2, 4, 8), torch.randn(2, 2, 8),
                         torch.randn(16, 8), 8) is None
    cache = torch.empty(4, 2, 2, 8, device=m)
    assert kernels.paged_decode(q, k, k, cache, cache, torch.zeros(2, dtype=torch.int64, device=m),
                                torch.zeros(2, 1, dtype=torch.int32, device=m),
                                torch.ones(2, dtype=torch.int32, device=m), 2, 0.3) is None
    cpu_q, cpu_k = torch.randn(2, 4, 8), torch.randn(2, 2, 8)  # CPU activations, cache elsewhere
    assert kernels.paged_decode(cpu_q, cpu_k, cpu_k, cache, cache, torch.zeros(2, dtype=torch.int64),
                                torch.zeros(2, 1, dtype=torch.int32),
                                torch.ones(2, dtype=torch.int32), 2, 0.3) is None


def test_status_names_the_library():
    st = kernels.status()
    assert st.available and "libinfer_cpu_kernels" in st.detail


def test_packed_tiles_stop_at_their_memory_budget(monkeypatch, caplog):
    """Tiles are packed while the live ones fit the budget (a share of the memory available at
    the first packing); past it a matrix keeps repacking per call, with one warning, and the same
    bits; freed tiles give their bytes back."""
    import gc

    qw = _gguf(40, 96, Q.Q4_1, seed=5)[1].with_activations("int16")
    n = kernels._lib().infer_tiles_bytes(qw.kind, qw.out_features, qw.in_features)
    if not n:
        pytest.skip("this build does not read packed tiles")
    monkeypatch.setattr(kernels, "_tiles_budget", {"left": n + n // 2, "warned": False})
    first = kernels.with_tiles(qw)  # room for one matrix
    assert first.tiles is not None and first.tiles.numel() == n
    with caplog.at_level("WARNING", logger=kernels.__name__):
        second, third = kernels.with_tiles(qw), kernels.with_tiles(qw)
    assert second.tiles is None and third.tiles is None
    assert sum("packed weight tiles" in r.message for r in caplog.records) == 1
    x = torch.randn(8, 96)
    assert torch.equal(kernels.fgemm(x, first), kernels.fgemm(x, second))
    del first
    gc.collect()
    assert kernels._tiles_budget["left"] == n + n // 2
    assert kernels.with_tiles(qw).tiles is not None
    monkeypatch.setenv("INFER_CPU_PACKED_TILES", "0")
    assert kernels.with_tiles(qw).tiles is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_embed_rows_is_the_torch_lookup(dtype):
    """The native graphs' embedding lookup (``kernels.embed_rows``) gives F.embedding(...).float()
    exactly, for each table dtype, a strided table and repeated ids; an id outside the table
    raises IndexError (as torch's lookup does), and what the kernel does not read gives None."""
    g = torch.Generator().manual_seed(5)
    wide = (torch.randn(300, 80, generator=g) * 10).to(dtype)
    for w in (wide, wide[:, :67]):  # a table whose rows are strided
        ids = torch.tensor([0, 299, 7, 7, 150, 1, 298])
        got = kernels.embed_rows(w, ids)
        assert got is not None and got.dtype == torch.float32
        assert torch.equal(got, F.embedding(ids, w).float())
    assert kernels.embed_rows(wide, torch.empty(0, dtype=torch.int64)).shape == (0, 80)
    for bad in (300, -1):
        with pytest.raises(IndexError):
            kernels.embed_rows(wide, torch.tensor([3, bad]))
    assert kernels.embed_rows(wide, torch.tensor([1, 2], dtype=torch.int32)) is None
    assert kernels.embed_rows(wide.t(), torch.tensor([1])) is None


def test_native_graph_embedding_matches_the_module():
    """embed_input (the native graphs' first step) against the model's own embedding module on
    one rank; a vocabulary-parallel embedding keeps the module (its all-reduce)."""
    from types import SimpleNamespace

    from infer.core.model.layers.embedding import VocabEmbedding
    from infer_cpu.graph_bf16 import embed_input

    emb = VocabEmbedding(50, 16, SimpleNamespace(dtype=torch.bfloat16, device="cpu"))
    emb.weight.data.copy_(torch.randn(50, 16))
    model = SimpleNamespace(model=SimpleNamespace(embed_tokens=emb))
    ids = torch.tensor([4, 49, 0, 4])
    assert torch.equal(embed_input(model, ids), emb(ids).float())
    calls = []
    emb.tp_size = 2  # the module's path, not the kernel's
    emb.forward = lambda x: (calls.append(x), torch.zeros(len(x), 16))[1]
    assert torch.equal(embed_input(model, ids), torch.zeros(4, 16)) and len(calls) == 1
