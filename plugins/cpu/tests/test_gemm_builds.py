"""The native block GEMM (``kernels.fgemm``) in its three activation precisions -- float32, int16
and int8 (``QWeight.with_activations``, ``INFER_CPU_ACTIVATIONS``) -- against float64 references
on the exact dequantised weights, in every build this CPU can run: the machine's own
(``-march=native``: AVX-512 and VNNI here), AVX2 only, AVX-512 without VNNI, and portable C. Every
path is written so that every build gives the same bits (one chain per output in a fixed order,
exact integer block dot products), which the tests check too: a tile, a tail or an instruction
set that summed differently would show up as a difference. The integer paths are also compared
bit for bit with an independent torch emulation of their arithmetic (``_integer_reference``).

Shapes cover the tiles' remainders: weight rows N around the 16-row integer tiles, the 8-row in-
place blocks and 4-row float chunks, activation rows M around the in-place path's pairs (up to 4
rows), the 8- and 6-row register tiles, the 64-row float blocks and the 256-row int8 blocks, K of 1
to 18 blocks."""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import pytest
import torch
from infer_cpu import kernels
from infer_cpu.quant.packing import Q, QWeight, gguf_qweight, quantize_q8_blocks

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason=f"native kernels unavailable: {kernels.status().detail}")


def _cpu_flags() -> set[str]:
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("flags"))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


# build name -> (compiler flags, CPU flags it needs)
BUILDS = {
    "avx2": (["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"], {"avx2", "fma", "f16c"}),
    "avx512-no-vnni": (["-O3", "-march=native", "-mno-avx512vnni", "-fopenmp"],
                       {"avx512f", "avx512bw", "avx512vl"}),
    "portable": (["-O2"], set()),
    # the machine's AVX-512 VNNI tiles where the native build runs the integer GEMM on AMX tiles
    "native-no-amx": (["-O3", "-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16",
                       "-fopenmp"], {"amx_tile", "amx_int8"}),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory, compile_kernels) -> dict[str, ctypes.CDLL]:
    """The kernels compiled with each BUILDS entry this CPU runs (x86-64 with a C compiler)."""
    have, libs = _cpu_flags(), {}
    for name, (flags, needs) in BUILDS.items():
        if not needs <= have:
            continue
        lib = compile_kernels(tmp_path_factory, f"build_{name}", flags)
        lib.infer_set_threads(1)
        libs[name] = lib
    return libs


def _call(lib: ctypes.CDLL, x: torch.Tensor, w: QWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``lib``'s GEMM into a NaN-filled output, reading ``w``'s packed tiles where it has them."""
    y = torch.full((x.shape[0], w.out_features), float("nan"))
    lib.infer_fgemm_tiles(w.kind, x.data_ptr(), x.stride(0), x.shape[0], w.in_features,
                          w.blocks.data_ptr(), w.tiles.data_ptr() if w.tiles is not None else None,
                          bias.data_ptr() if bias is not None else None, w.out_features,
                          y.data_ptr(), w.out_features)
    return y


def _packed(w: QWeight, packed: bool) -> QWeight:
    """``w`` with its tiles packed (``kernels.with_tiles``) when ``packed``; on a build that reads
    packed tiles for its kind they must then be there, so the packed cases are not the plain
    ones run twice."""
    if not packed:
        return w
    pw = kernels.with_tiles(w)
    if kernels._lib().infer_tiles_bytes(w.kind, w.out_features, w.in_features):
        assert pw.tiles is not None and pw.tiles.numel() > 0
    else:
        assert pw.tiles is None
    return pw


def _weights(n: int, k: int, qtype: Q, seed: int) -> QWeight:
    g = torch.Generator().manual_seed(seed)
    # rows and blocks of very different magnitudes: a scale read from the wrong block or row
    # changes the result far beyond rounding
    scales = torch.rand(n, k // 32, 1, generator=g).add(0.05) * torch.rand(n, 1, 1, generator=g) * 4
    w = (torch.randn(n, k // 32, 32, generator=g) * scales).reshape(n, k)
    if qtype == "lm":
        return quantize_q8_blocks(w)
    return gguf_qweight(torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype)), qtype, n)


def _activations(m: int, k: int, seed: int) -> torch.Tensor:
    """[m, k] rows of stride k + 40 (a view), scales differing per row and block, one zero block
    (scale 0) and one block holding a single large value (codes at +-127)."""
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(m, k + 40, generator=g)
    x = big[:, 24:24 + k]
    x.mul_(torch.rand(m, k // 32, generator=g).add(0.01).repeat_interleave(32, 1) * 6)
    x[0, :32] = 0
    if k >= 64:
        x[-1, 32:64] = 0.01
        x[-1, 40] = -50.0
    return x


QMAX = {"int8": 127, "int16": 32767}


def _codes(x: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The integer path's activations: per row and 32-block d = amax / qmax and codes
    round(x * (1 / d)) half to even, in float32 as the C code computes them: (codes [m, nb, 32]
    int64, d [m, nb] float32)."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    d = xb.abs().amax(-1) / QMAX[precision]
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    return torch.round(xb * inv[..., None]).long(), d


def _dequantised_rows(x: torch.Tensor, precision: str) -> torch.Tensor:
    """The activations the path multiplies, as floats."""
    if precision == "float32":
        return x
    q, d = _codes(x, precision)
    return (q.float() * d[..., None]).reshape(x.shape)


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c): the product of two float32 is exact in float64, and the float64 sum
    rounded to float32 is the fma's single rounding unless the float64 rounding lands on a float32
    tie (about one case in 2^28 per operation)."""
    return (a.double() * b.double() + c.double()).float()


def _block_parts(w: QWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight scales dw [n, nb], minimums mw [n, nb] (zero for Q8_0) and codes [n, nb, 32]."""
    n, nb = w.out_features, w.in_features // 32
    b = w.blocks.reshape(n, nb, -1)
    dw = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    if w.block_kind == 4:
        mw = b[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
        return dw, mw, torch.cat([b[..., 4:] & 0x0F, b[..., 4:] >> 4], dim=-1).long()
    return dw, torch.zeros_like(dw), b[..., 2:].contiguous().view(torch.int8).long()


def _integer_reference(x: torch.Tensor, w: QWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """An independent torch emulation of the integer-activation GEMM's arithmetic: the codes, the
    exact integer block dots (int64 here), then per output one float32 chain over the blocks,
    acc = fma(float(dot_b), dw_b * dx_b, acc) and, Q4_1, acc = fma(mw_b, sx_b, acc) with
    sx_b = dx_b * float(sum(qx_b)); then + bias. The kernels must match it bit for bit."""
    q, dx = _codes(x, w.activations)  # [m, nb, 32], [m, nb]
    nb = w.in_features // 32
    dw, mw, codes = _block_parts(w)
    dots = torch.einsum("mbj,nbj->mnb", q, codes)  # exact int64
    assert dots.abs().max() < 2**31
    sx = dx * q.sum(-1).float()  # [m, nb]
    acc = torch.zeros(x.shape[0], w.out_features)
    for i in range(nb):
        acc = _fma32(dots[..., i].float(), dw[None, :, i] * dx[:, None, i], acc)
        if w.block_kind == 4:
            acc = _fma32(mw[None, :, i].expand_as(acc), sx[:, None, i].expand_as(acc), acc)
    return acc + bias if bias is not None else acc


def _check(y: torch.Tensor, x: torch.Tensor, w: QWeight, bias: torch.Tensor | None) -> None:
    """Every element within float rounding of the float64 product of the activations the path
    multiplies and the exact dequantised weights; the integer paths also bit for bit equal to
    ``_integer_reference``."""
    if w.activations != "float32":
        assert torch.equal(y, _integer_reference(x, w, bias))
    xa = _dequantised_rows(x, w.activations)
    wd = w.dequantize().double()
    want = xa.double() @ wd.t()
    scale = xa.double().abs() @ wd.abs().t()
    if w.activations != "float32" and w.block_kind == 4:
        # the integer paths sum d q x and m x apart: their terms, not w x, set the rounding
        dw, mw, codes = _block_parts(w)
        wa = (dw[..., None] * codes).abs() + mw.abs()[..., None]
        scale = xa.double().abs() @ wa.reshape(wd.shape).double().t()
    if bias is not None:
        want, scale = want + bias.double(), scale + bias.double().abs()
    err = ((y.double() - want).abs() / scale.clamp(min=1e-30)).max().item()
    assert err < 2e-6, err


CASES = [  # (N, K, M)
    (1, 32, 1), (5, 64, 1), (37, 160, 1), (3, 64, 2), (21, 96, 3), (40, 160, 5), (17, 64, 6), (15, 96, 7), (16, 160, 8), (17, 160, 9), (37, 576, 13), (50, 128, 33),
    (48, 576, 16), (70, 128, 34), (33, 64, 67), (20, 576, 131),
]


PRECISIONS = ["float32", "int16", "int8"]


@pytest.mark.parametrize("packed", [False, True], ids=["repacked", "packed"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, "lm"])
@pytest.mark.parametrize("n,k,m", CASES)
def test_native_build_against_reference(precision, qtype, n, k, m, packed, with_threads):
    """packed: the weights' tiles packed at load (``kernels.with_tiles``), read by the integer
    paths from 3 rows on (two tiles side by side from 16 rows, where N has two whole tiles)."""
    w = _packed(_weights(n, k, qtype, seed=7 * n + k + m).with_activations(precision), packed)
    x = _activations(m, k, seed=n + m)
    bias = torch.randn(n) if n % 2 else None
    for threads in (1, 2):  # through the wrapper, and into a NaN-filled output (a skipped element)
        y = with_threads(threads, lambda: kernels.fgemm(x, w, bias))
        _check(y, x, w, bias)
        assert torch.equal(with_threads(threads, lambda: _call(kernels._lib(), x, w, bias)), y)


@pytest.mark.parametrize("packed", [False, True], ids=["repacked", "packed"])
@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_every_build_gives_the_same_bits(builds, build, precision, qtype, packed, with_threads):
    """Each build against the reference, and bit for bit equal to the machine's own build
    (packed: given the tiles the machine's build packed; a build that does not read them for the
    kind, the portable one, say, ignores them)."""
    if build not in builds:
        pytest.skip(f"this CPU does not run the {build} build")
    for n, k, m in CASES[:-1]:
        w = _packed(_weights(n, k, qtype, seed=n * k + m).with_activations(precision), packed)
        x = _activations(m, k, seed=m)
        bias = torch.randn(n)
        y = _call(builds[build], x, w, bias)
        _check(y, x, w, bias)
        assert torch.equal(y, with_threads(1, lambda x=x, w=w, b=bias: kernels.fgemm(x, w, b))), (n, k, m)


@pytest.mark.parametrize("packed", [False, True], ids=["repacked", "packed"])
@pytest.mark.parametrize("precision", ["int16", "int8"])
def test_integer_blocks_of_more_than_256_rows(precision, packed, with_threads):
    """Past the integer paths' 256-row activation blocks (a prefill), both threads."""
    w = _packed(_weights(40, 96, Q.Q4_1, seed=3).with_activations(precision), packed)
    x = _activations(300, 96, seed=4)
    alone = torch.cat([kernels.fgemm(x[i:i + 1], w) for i in range(x.shape[0])])
    for threads in (1, 2):
        y = with_threads(threads, lambda: kernels.fgemm(x, w))
        _check(y, x, w, None)
        assert torch.equal(y, alone)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_int16_codes_and_weight_codes_at_their_extremes(builds, qtype, with_threads):
    """int16 codes over their whole range (+-32767, the multiples of 256 and their neighbours,
    where the AMX path's split x = 256 hi + lo changes hi) against weight codes over theirs (Q8_0:
    -128 .. 127, set in the blocks directly; Q4_1: 0 .. 15): bit for bit the reference, at 1 to 40
    rows, in the native build and in every other build this CPU runs."""
    n, k = 50, 256
    g = torch.Generator().manual_seed(5)
    w = _weights(n, k, qtype, seed=6)
    if qtype == Q.Q8_0:  # codes anywhere in int8, -128 included (GGUF's quantizer stops at -127)
        b = w.blocks.reshape(n, k // 32, -1)
        b[..., 2:] = torch.randint(0, 256, b[..., 2:].shape, generator=g, dtype=torch.uint8)
        b[0, 0, 2:] = 128  # a block of -128 codes
        b[1, 0, 2:] = 127
    w = _packed(w.with_activations("int16"), True)
    special = torch.tensor([32767, -32767, 256, -256, 255, -255, 257, -257, 1, -1, 0, 128, -128,
                            32512, -32512, 32511, -32513], dtype=torch.float32)
    codes = torch.randint(-32767, 32768, (40, k), generator=g).float()
    codes[:, ::32] = 32767  # each block's largest code, so that d = 1 exactly
    codes[::2, 1:1 + special.numel()] = special
    codes[3, :32] = -32767.0  # a block at the negative end
    codes[3, 0] = 32767.0
    x = codes * 2.0**-7  # d = 32767 * 2^-7 / 32767: the codes come back exactly
    q, _ = _codes(x, "int16")
    assert torch.equal(q.reshape(40, k).float(), codes)
    for m in (1, 3, 16, 17, 40):
        want = _integer_reference(x[:m], w, None)
        for threads in (1, 2):
            assert torch.equal(with_threads(threads, lambda m=m: kernels.fgemm(x[:m], w)), want), m
        for name, lib in builds.items():
            assert torch.equal(_call(lib, x[:m], w, None), want), (name, m)


def test_activation_flags_keep_the_blocks():
    w = _weights(8, 64, Q.Q4_1, seed=1)
    assert w.activations == "float32"
    for precision in ("int8", "int16"):
        wi = w.with_activations(precision)
        assert wi.blocks is wi.blocks and wi.activations == precision and wi.block_kind == w.kind == 4
        assert wi.with_activations("float32").kind == w.kind
        torch.testing.assert_close(wi.dequantize(), w.dequantize(), rtol=0, atol=0)
    assert w.with_int8_activations().int8_activations and not w.int8_activations
    with pytest.raises(ValueError, match="int4"):
        w.with_activations("int4")


def test_int16_codes_are_finer_than_int8():
    """The int16 path multiplies (to float rounding) the activations themselves: relative error
    about 2^-16 of each block's largest value, where int8 has 2^-8 (a sanity check that int16 is
    not int8 relabelled)."""
    x = _activations(9, 576, seed=11)
    w = _weights(24, 576, Q.Q4_1, seed=12)
    want = x.double() @ w.dequantize().double().t()
    err = {p: ((kernels.fgemm(x, w.with_activations(p)).double() - want).norm() / want.norm()).item()
           for p in ("int8", "int16")}
    assert err["int16"] < 1e-4 < err["int8"] < 3e-2 and err["int16"] < err["int8"] / 100, err


def _argmax_rows() -> list[tuple[torch.Tensor, list[int] | None]]:
    """Rows for greedy sampling's argmax, each with the indices torch.argmax gives (None: random
    rows, checked against torch only). The special values sit in vector bodies and in tails."""
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[torch.Tensor, list[int] | None]] = []
    for n in (1, 7, 8, 9, 15, 16, 17, 33, 100, 4099):
        cases.append((torch.randn(3, n, generator=g), None))
    nan, inf = float("nan"), float("inf")

    def row(n: int, fill: float, at: dict[int, float]) -> torch.Tensor:
        r = torch.full((n,), fill)
        for i, v in at.items():
            r[i] = v
        return r

    special = [  # (row, expected)
        (row(100, 0.0, {37: 5.0, 3: 5.0, 90: 5.0}), 3),        # ties: the first one
        (row(100, 0.0, {99: 5.0, 98: 5.0}), 98),                 # ties in the tail
        (row(40, 1.0, {}), 0),                                    # all equal
        (row(40, -inf, {}), 0),                                   # all -inf
        (row(40, 0.0, {20: inf, 5: inf, 6: 3.0}), 5),             # +inf twice
        (row(100, 0.0, {10: 9.0, 50: nan}), 50),                  # NaN after the maximum wins
        (row(100, 0.0, {10: 9.0, 98: nan}), 98),                  # NaN in the tail
        (row(100, 0.0, {70: nan, 30: nan, 10: 9.0}), 30),         # the first NaN
        (row(33, -1.0, {5: -0.0, 3: 0.0}), 3),                    # -0 and +0 are equal
        (row(33, -1.0, {9: 0.0, 2: -0.0}), 2),
        (row(35, -2.0, {34: -1.0}), 34),                          # the last element
    ]
    cases += [(r[None], [e]) for r, e in special]
    wide = torch.randn(4, 300, generator=g)
    cases.append((wide[:, :257], None))  # rows with a stride wider than they are
    return cases


def _lib_argmax(lib: ctypes.CDLL, x: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0],), -1, dtype=torch.int64)
    lib.infer_argmax_rows(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr())
    return out


@pytest.mark.parametrize("build", ["native", *BUILDS])
def test_argmax_rows_is_torch_argmax(builds, build):
    """The native greedy argmax (``kernels.argmax_rows``, ``CpuPlatform.greedy_ids``) in every
    build gives exactly torch.argmax's ids: first maxima, NaN above everything, -0 == +0."""
    from infer_cpu.probe import CpuPlatform

    if build != "native" and build not in builds:
        pytest.skip(f"this CPU does not run the {build} build")
    for x, expected in _argmax_rows():
        want = x.argmax(dim=-1)
        if expected is not None:
            assert want.tolist() == expected  # what torch does, stated
        got = kernels.argmax_rows(x) if build == "native" else _lib_argmax(builds[build], x)
        assert got is not None and torch.equal(got, want), (x.shape, got, want)
    x = torch.randn(2, 9)
    assert torch.equal(CpuPlatform.greedy_ids(None, x), x.argmax(dim=-1))  # type: ignore[arg-type]
    assert kernels.argmax_rows(x.double()) is None  # not float32 rows: torch's
    assert kernels.argmax_rows(x.t()) is None
