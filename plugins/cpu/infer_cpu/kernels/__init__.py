"""Native CPU kernels (``infer_cpu_kernels.c``), compiled on first use and called via ctypes.

The C file is compiled for the machine that runs it (``-O3 -march=native -fopenmp``) into
``$INFER_CACHE_DIR/kernels/<hash>/`` (default ``~/.cache/infer``), keyed by the source, the
compiler flags and the CPU, then loaded with ctypes. Compiling takes about a second; later starts
reuse the library. Without a C compiler (or with ``INFER_CPU_KERNELS=0``) ``load()`` returns None
and the plugin uses the plain-torch ops; ``status()`` says which and why (``infer doctor``).

The wrappers below take torch tensors, check what the kernels assume (float32, strides) and
return None when a call does not fit, so callers fall back to torch: a kernel never sees an
input it was not written for.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from infer_cpu.native_build import build, compiler, disabled, pool_swap_setting

if TYPE_CHECKING:
    from infer_cpu.quant.packing import QWeight

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, object] = {}

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
_F = ctypes.c_float


class Layer(ctypes.Structure):
    """One decoder layer of ``infer_decode_layers`` (the C ``infer_layer``): norm weights, the
    four projections' blocks and kinds, the qkv bias (or NULL), the layer's KV caches and the
    projections' packed tiles (``with_tiles``; NULL where not packed)."""

    _fields_ = [("in_norm", _P), ("post_norm", _P), ("wqkv", _P), ("wo", _P), ("wgu", _P),
                ("wdown", _P), ("bqkv", _P), ("kind_qkv", _I), ("kind_o", _I), ("kind_gu", _I),
                ("kind_down", _I), ("k_cache", _P), ("v_cache", _P), ("tqkv", _P), ("to", _P),
                ("tgu", _P), ("tdown", _P)]


# infer_kernels_isa(): where the integer-activation GEMM runs (AMX from a dozen rows, the
# AVX-512 VNNI register tiles below them)
ISA_NAMES = {4: "amx_int8 + avx512_vnni", 3: "avx512_vnni", 2: "avx2", 0: "portable C"}

_SIGNATURES = {
    "infer_set_threads": [_I],
    "infer_kernels_isa": [],
    "infer_qgemm": [_I, _P, _L, _I, _I, _I, _P, _P, _I, _P, _L],
    "infer_fgemm": [_I, _P, _L, _I, _I, _P, _P, _I, _P, _L],
    "infer_fgemm_tiles": [_I, _P, _L, _I, _I, _P, _P, _P, _I, _P, _L],
    "infer_tiles_bytes": [_I, _I, _I],
    "infer_pack_tiles": [_I, _P, _I, _I, _P],
    "infer_rms_norm": [_P, _L, _P, _L, _P, _P, _P, _I, _I, _F],
    "infer_rope": [_P, _P, _L, _I, _P, _L, _I, _I, _I, _I, _P],
    "infer_silu_mul": [_P, _L, _P, _I, _I],
    "infer_argmax_rows": [_P, _L, _I, _I, _P],
    "infer_embed_rows": [_P, _I, _L, _L, _P, _I, _I, _P],
    "infer_paged_decode": [_P, _L, _P, _L, _P, _L, _P, _P, _P, _P, _L, _P, _P, _I, _I, _I, _I,
                           _I, _F, _I],
    "infer_decode_layers": [ctypes.POINTER(Layer), _I, _P, _I, _I, _I, _I, _I, _I, _F, _P, _P, _I,
                            _P, _P, _L, _P, _I, _F, _P, _P, _I],
    "infer_pool_swaps": [_I],
    "infer_q8_screen_ok": [],
    "infer_q8_head_greedy": [_P, _L, _I, _I, _P, _P, _I, _P],
}
_RESTYPES = {"infer_kernels_isa": _I, "infer_embed_rows": _L, "infer_decode_layers": _I,
             "infer_tiles_bytes": ctypes.c_size_t, "infer_pool_swaps": _I,
             "infer_q8_screen_ok": _I, "infer_q8_head_greedy": _I}


@dataclass
class Status:
    available: bool
    detail: str  # the library and flags, or why the kernels are not used


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """lib (a build of ``infer_cpu_kernels.c``) with every exported function's argument and
    result types set."""
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = _RESTYPES.get(name)
    return lib


def load() -> ctypes.CDLL | None:
    """The compiled library (built on first call), or None with the reason in ``status()``."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]  # type: ignore[return-value]
        lib, detail = None, ""
        if disabled():
            detail = "disabled by INFER_CPU_KERNELS=0"
        elif (cc := compiler()) is None:
            detail = "no C compiler (cc/gcc/clang) on PATH; using plain-torch ops"
        else:
            try:
                path, flags = build(cc)
                lib = bind(ctypes.CDLL(str(path)))
                lib.infer_pool_swaps(pool_swap_setting())
                isa = ISA_NAMES.get(lib.infer_kernels_isa(), "portable C")
                detail = f"{path} ({cc} {' '.join(flags)}; {isa})"
            except (OSError, RuntimeError, AttributeError) as e:
                lib, detail = None, f"could not build the native kernels: {e}"
                logger.warning("%s; using plain-torch ops", detail)
        _state["lib"], _state["detail"] = lib, detail
        return lib


def status() -> Status:
    lib = load()
    return Status(lib is not None, str(_state.get("detail", "")))


_threads = [0]


def _lib() -> ctypes.CDLL | None:
    """The library with its work pool sized to torch's current thread count."""
    lib = _state["lib"] if "lib" in _state else load()
    if lib is not None:
        n = torch.get_num_threads()
        if n != _threads[0]:
            lib.infer_set_threads(n)
            _threads[0] = n
    return lib  # type: ignore[return-value]


_F32 = torch.float32


def _f32_rows(t: torch.Tensor) -> bool:
    """float32 CPU, 2-D with unit column stride (rows may be strided)."""
    return t.dtype is _F32 and t.dim() == 2 and t.stride(1) == 1 and _on_cpu(t)


def _on_cpu(*ts: torch.Tensor) -> bool:
    """The kernels read host memory: a tensor on any other device (a CUDA reference run of the
    torch_native backend, say) goes to the torch path."""
    return all(t.device.type == "cpu" for t in ts)


# -- quantized weights (``infer_cpu.quant.packing.QWeight``: GGUF Q4_1 / Q8_0 blocks) ------

def qgemm(x: torch.Tensor, w: QWeight, bias: torch.Tensor | None = None,
          silu_mul: bool = False) -> torch.Tensor | None:
    """x [M, K] float32 (or [M, 2K] with ``silu_mul``) -> [M, N]; None if the kernels are off.

    The activations are quantized to int8 per 32-block (llama.cpp's Q8 scheme)."""
    lib = _lib()
    k = w.in_features
    if lib is None or not _f32_rows(x) or x.shape[1] != (2 * k if silu_mul else k):
        return None
    if bias is not None and (bias.dtype is not _F32 or not bias.is_contiguous()):
        return None
    m = x.shape[0]
    y = torch.empty(m, w.out_features, dtype=_F32)
    lib.infer_qgemm(w.block_kind, x.data_ptr(), x.stride(0), m, k, int(silu_mul), w.blocks.data_ptr(),
                    bias.data_ptr() if bias is not None else None, w.out_features,
                    y.data_ptr(), w.out_features)
    return y


def fgemm(x: torch.Tensor, w: QWeight, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [M, K] float32 -> [M, N] in ``w.activations`` precision: float32 activations against the
    blocks dequantized exactly, or the activations quantized per row and 32-block to int16 or
    int8 codes and exact integer block dot products; None if the kernels are off or the input does
    not fit. Batch invariant in every precision: row m of the result is bit for bit the same
    whatever the other rows (``infer_cpu_kernels.c`` says how)."""
    lib = _lib()
    if lib is None or not _f32_rows(x) or x.shape[1] != w.in_features:
        return None
    if bias is not None and (bias.dtype is not _F32 or not bias.is_contiguous()):
        return None
    m = x.shape[0]
    y = torch.empty(m, w.out_features, dtype=_F32)
    lib.infer_fgemm_tiles(w.kind, x.data_ptr(), x.stride(0), m, w.in_features, w.blocks.data_ptr(),
                          w.tiles.data_ptr() if w.tiles is not None else None,
                          bias.data_ptr() if bias is not None else None, w.out_features,
                          y.data_ptr(), w.out_features)
    return y


def tiles_enabled() -> bool:
    """Whether ``with_tiles`` packs (``INFER_CPU_PACKED_TILES=0`` turns it off: the GEMM then
    repacks the blocks on every call, for the same numbers, in less memory)."""
    return os.environ.get("INFER_CPU_PACKED_TILES", "1") != "0"


TILES_MEMORY_SHARE = 0.25  # live packed tiles may take this share of the memory available at the first
# bytes the live packed tiles may still take (None: not measured yet), and whether the warning
# that the budget ran out was given
_tiles_budget: dict[str, int | bool | None] = {"left": None, "warned": False}


def _release_tiles(budget: dict, n: int) -> None:
    """Freed tiles' bytes back to the budget they were taken from."""
    with _lock:
        budget["left"] += n


def _available_memory() -> int:
    from infer_cpu.probe import available_memory

    avail = available_memory()
    return avail if avail is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def with_tiles(w: QWeight) -> QWeight:
    """``w`` with its blocks also packed into the integer-activation GEMM's register-tile layout
    (about 1.25 bytes a weight beside the blocks' 0.56-1.06), which the GEMM then reads instead
    of repacking the blocks on every call of 3 rows or more (``infer_cpu_kernels.c``, "Tiles
    packed once"). The numbers are the same bits either way. ``w`` unchanged where this build
    does not read packed tiles for ``w.kind`` (no AVX2, float32 activations, int8 activations
    on AVX-512 VNNI), the kernels are off, ``INFER_CPU_PACKED_TILES=0``, or the live tiles of
    this process would pass ``TILES_MEMORY_SHARE`` of the memory available when the first was
    packed (a large model on a small machine: the layers past it repack per call, said once;
    freed tiles give their bytes back)."""
    lib = _lib()
    if lib is None or not tiles_enabled() or w.tiles is not None:
        return w
    n = lib.infer_tiles_bytes(w.kind, w.out_features, w.in_features)
    if not n:
        return w
    budget = _tiles_budget
    with _lock:
        if budget["left"] is None:
            budget["left"] = int(_available_memory() * TILES_MEMORY_SHARE)
        if n > budget["left"]:  # type: ignore[operator]
            if not budget["warned"]:
                logger.warning("packed weight tiles would pass %.0f%% of the available memory: "
                               "the layers past it repack their weights per call (the same "
                               "numbers, slower steps of 3 rows or more)",
                               100 * TILES_MEMORY_SHARE)
                budget["warned"] = True
            return w
        budget["left"] -= n  # type: ignore[operator]
    from infer_cpu import hugepages

    tiles = hugepages.alloc(n)  # read by every step of 3 rows or more
    weakref.finalize(tiles, _release_tiles, budget, n)
    lib.infer_pack_tiles(w.kind, w.blocks.data_ptr(), w.out_features, w.in_features,
                         tiles.data_ptr())
    return replace(w, tiles=tiles)


# -- layer ops -----------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(normed, x + residual or None), or None when the inputs do not fit the kernel."""
    lib = _lib()
    if (lib is None or x.dim() != 2 or not _f32_rows(x) or weight.dtype != torch.float32
            or not _on_cpu(weight)):
        return None
    if residual is not None and (not _f32_rows(residual) or residual.shape != x.shape):
        return None
    rows, dim = x.shape
    out = torch.empty(rows, dim, dtype=torch.float32)
    res_out = torch.empty(rows, dim, dtype=torch.float32) if residual is not None else None
    lib.infer_rms_norm(x.data_ptr(), x.stride(0),
                       residual.data_ptr() if residual is not None else None,
                       residual.stride(0) if residual is not None else 0,
                       res_out.data_ptr() if res_out is not None else None,
                       weight.data_ptr(), out.data_ptr(), rows, dim, float(eps))
    return out, res_out


def _heads_view(t: torch.Tensor) -> bool:
    """[T, heads, D] float32 on the CPU with contiguous heads (the row stride may be larger)."""
    return (t.dtype == torch.float32 and t.dim() == 3 and t.stride(2) == 1
            and t.stride(1) == t.shape[2] and _on_cpu(t))


def rope_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
          rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rotate q [T, H, D] and k [T, Hkv, D] in place and return them; None (nothing done) if
    they do not fit."""
    lib = _lib()
    if (lib is None or not _heads_view(q) or not _heads_view(k) or positions.dtype != torch.int64
            or not positions.is_contiguous() or cos_sin.dtype != torch.float32
            or not _on_cpu(positions, cos_sin)
            or not cos_sin.is_contiguous() or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]):
        return None
    t, h, d = q.shape
    lib.infer_rope(positions.data_ptr(), q.data_ptr(), q.stride(0), h, k.data_ptr(), k.stride(0),
                   k.shape[1], t, d, rotary_dim, cos_sin.data_ptr())
    return q, k


def silu_mul(x: torch.Tensor) -> torch.Tensor | None:
    """x [T, 2I] -> silu(x[:, :I]) * x[:, I:]; None if it does not fit."""
    lib = _lib()
    if lib is None or not _f32_rows(x) or x.shape[1] % 2:
        return None
    t, i = x.shape[0], x.shape[1] // 2
    out = torch.empty(t, i, dtype=torch.float32)
    lib.infer_silu_mul(x.data_ptr(), x.stride(0), out.data_ptr(), t, i)
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor | None:
    """logits [B, V] float32 -> int64 [B], what ``logits.argmax(dim=-1)`` gives (the first NaN,
    else the first maximum); None if it does not fit (the caller uses torch)."""
    lib = load()
    if lib is None or not _f32_rows(logits) or 0 in logits.shape:
        return None
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    lib.infer_argmax_rows(logits.data_ptr(), logits.stride(0), logits.shape[0], logits.shape[1],
                          out.data_ptr())
    return out


class Q8Screen(ctypes.Structure):
    """The greedy Q8_0 head's screen (the C ``infer_q8_screen``; ``Q8ScreenData`` builds it)."""

    _fields_ = [("q", _P), ("scale", _P), ("csum", _P), ("err", _P), ("qnorm", _P),
                ("wnorm", _P), ("K", _I)]


@dataclass
class ColumnCodes:
    """An LM head [V, K]'s int8 copy for a greedy screen (the C files' "greedy LM head"s): per
    column n the scale s_n = max|w_n| / 127 and codes c_n = rint(w_n / s_n), packed
    [ceil(V / 16), K / 4, 16, 4] (the AMX B tile's layout) on huge pages (streamed every greedy
    step), and the bound's column terms, computed in float64 and rounded up: ``offset`` sum(c_n)
    (the activation codes' offset), ||w_n - s_n c_n||, s_n ||c_n||, ||w_n||. Padding columns
    are 0 throughout."""

    codes: torch.Tensor
    scale: torch.Tensor
    csum: torch.Tensor
    err: torch.Tensor
    qnorm: torch.Tensor
    wnorm: torch.Tensor

    BLOCK = 16

    @classmethod
    def of(cls, w: torch.Tensor, offset: int) -> ColumnCodes:
        from infer_cpu import hugepages

        v, k = w.shape
        nb = -(-v // cls.BLOCK)
        out = cls(hugepages.alloc(nb * cls.BLOCK * k).view(torch.int8).view(nb, k // 4, cls.BLOCK, 4),
                  torch.empty(nb * cls.BLOCK), torch.empty(nb * cls.BLOCK, dtype=torch.int32),
                  *(torch.empty(nb * cls.BLOCK) for _ in range(3)))
        up = 1 + 2.0 ** -20  # float64 norms rounded to float32: a relative nudge upward
        step = 256 * cls.BLOCK  # columns a pass: float64 temporaries of 4,096 x K, not of V x K
        for r0 in range(0, nb * cls.BLOCK, step):
            r1 = min(r0 + step, nb * cls.BLOCK)
            wd = torch.zeros(r1 - r0, k, dtype=torch.float64)  # padding columns stay 0
            wd[:max(0, min(v, r1) - r0)] = w[r0:min(v, r1)].double()
            scale = (wd.abs().amax(dim=1) / 127).float()  # the scale the kernels multiply by
            s64 = scale.double()
            q = torch.where(s64[:, None] > 0, torch.round(wd / s64.clamp_min(1e-300)[:, None]),
                            torch.zeros_like(wd)).clamp(-127, 127)
            out.codes[r0 // cls.BLOCK:r1 // cls.BLOCK] = (
                q.to(torch.int8).reshape(-1, cls.BLOCK, k // 4, 4).permute(0, 2, 1, 3))
            out.scale[r0:r1] = scale
            out.csum[r0:r1] = (offset * q.sum(dim=1)).to(torch.int32)
            out.err[r0:r1] = ((wd - s64[:, None] * q).norm(dim=1) * up).float()
            out.qnorm[r0:r1] = (s64 * q.norm(dim=1) * up).float()
            out.wnorm[r0:r1] = (wd.norm(dim=1) * up).float()
        return out

    def pointers(self) -> tuple[int, ...]:
        """(codes, scale, csum, err, qnorm, wnorm) as the C structs take them."""
        return tuple(t.data_ptr() for t in (self.codes, self.scale, self.csum, self.err,
                                            self.qnorm, self.wnorm))


class Q8ScreenData:
    """What ``q8_head_greedy`` screens greedy rows of a Q8_0 LM head with (the C file's "greedy
    Q8_0 LM head"): the dequantized head's ``ColumnCodes`` (offset 8192: the 14-bit activation
    codes' offset), and the head's blocks, which the candidates' exact logits read. ``struct``
    is the C view."""

    def __init__(self, w: QWeight) -> None:
        v, k = w.out_features, w.in_features
        if w.block_kind != 8 or k % 64 or k > 2048:
            raise ValueError("the Q8_0 screen needs Q8_0 blocks and K a multiple of 64, at most "
                             f"2048 (kind {w.block_kind}, K {k})")
        self.head = w.blocks
        self.cols = ColumnCodes.of(w.dequantize(), 8192)  # float32 [V, K]: exact
        self.err, self.qnorm, self.wnorm = self.cols.err, self.cols.qnorm, self.cols.wnorm
        self.out_features, self.in_features = v, k
        self.full_rows = 0  # rows of the last call that took every logit (tests, benchmarks)
        self.struct = Q8Screen(*self.cols.pointers(), k)


def q8_screen_available() -> bool:
    """Whether this build screens a Q8_0 head (AMX int8 tiles)."""
    lib = load()
    return lib is not None and bool(lib.infer_q8_screen_ok())


def q8_head_greedy(x: torch.Tensor, screen: Q8ScreenData) -> torch.Tensor | None:
    """x [B, K] float32 (the final-normed rows) -> int64 [B]: exactly ``fgemm(x, head).argmax(-1)``
    for the head ``screen`` was built from (kind 8 | KIND_I16: int16 activations), its exact
    logits computed only for the columns the screen cannot rule out. None if it does not fit."""
    lib = load()
    if (lib is None or not _f32_rows(x) or x.shape[1] != screen.in_features or x.shape[0] == 0
            or not lib.infer_q8_screen_ok()):
        return None
    ids = torch.empty(x.shape[0], dtype=torch.int64)
    screen.full_rows = lib.infer_q8_head_greedy(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1],
                                                ctypes.byref(screen.struct), screen.head.data_ptr(),
                                                screen.out_features, ids.data_ptr())
    return ids


def embed_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor | None:
    """float32 rows ``weight[ids]`` [T, dim] (weight float32, bf16 or fp16 [V, dim], ids int64
    [T]), as ``F.embedding(ids, weight).float()`` gives them, without OpenMP; None if it does not
    fit. An id outside [0, V) raises IndexError, as torch's lookup does."""
    lib = load()
    kind = KV_CODES.get(weight.dtype)  # the same codes: 0 float32, 1 bf16, 2 fp16
    if (lib is None or kind is None or weight.dim() != 2 or weight.stride(1) != 1
            or ids.dtype is not torch.int64 or ids.dim() != 1 or not _on_cpu(weight, ids)):
        return None
    ids = ids.contiguous()
    out = torch.empty(ids.shape[0], weight.shape[1], dtype=torch.float32)
    bad = lib.infer_embed_rows(weight.data_ptr(), kind, weight.stride(0), weight.shape[0],
                               ids.data_ptr(), ids.shape[0], weight.shape[1], out.data_ptr())
    if bad >= 0:
        raise IndexError(f"token id {int(ids[bad])} is outside the embedding's {weight.shape[0]} rows")
    return out


# The KV cache dtypes the native attention reads, as its ``kv16`` argument codes them.
KV_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, page_size: int, scale: float) -> torch.Tensor | None:
    """Write k/v [B, Hkv, D] at ``slots`` and attend q [B, H, D] over each sequence's pages.
    The caches are float32, or bf16 / fp16 (the new k/v rounded to nearest even on write)."""
    lib = _lib()
    if (lib is None or not (_heads_view(q) and _heads_view(k) and _heads_view(v))
            or k_cache.dtype not in KV_CODES
            or v_cache.dtype != k_cache.dtype
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())
            or slots.dtype != torch.int64 or block_tables.dtype != torch.int32
            or seq_lens.dtype != torch.int32 or block_tables.stride(1) != 1
            or not (slots.is_contiguous() and seq_lens.is_contiguous())
            or not _on_cpu(k_cache, v_cache, slots, block_tables, seq_lens)):
        return None
    b, h, d = q.shape
    out = torch.empty(b, h, d, dtype=torch.float32)
    lib.infer_paged_decode(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(),
                           v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                           block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(),
                           out.data_ptr(), b, h, k.shape[1], d, page_size, float(scale),
                           KV_CODES[k_cache.dtype])
    return out
