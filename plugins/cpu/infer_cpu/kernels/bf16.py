"""The bf16 kernels (``infer_cpu_bf16.c``): a GEMM on pair-packed bf16 weights and the whole
bf16 decode step, compiled on first use like ``infer_cpu_kernels.c`` (see ``native_build``) into
a library of their own and called via ctypes.

ISA paths, chosen when the library is compiled for this CPU: AMX (``tdpbf16ps`` on tiles, for the
projections' GEMMs whose K is a multiple of 32 and the prefill attention's two GEMMs, when
Linux grants the process the tile state; the rest of such a CPU's work runs the AVX-512 BF16
path), AVX-512 BF16 (``vdpbf16ps``), AVX2 +
FMA (weights widened to float32), portable C. The pair-packed layout is already an AMX weight
tile's. ``isa()`` says which one runs.

The wrappers check what the kernels assume (dtypes, strides, CPU tensors) and return None when
a call does not fit, so the caller runs the torch reference instead.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import torch

from infer_cpu.native_build import BF16_LIB_NAME, BF16_SOURCE, build, compiler, disabled, pool_swap_setting

logger = logging.getLogger(__name__)

BLOCK = 16  # output columns per packed block
ISA_NAMES = {4: "amx_bf16", 3: "avx512_bf16", 2: "avx2", 0: "portable C"}

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
_F = ctypes.c_float


class Layer(ctypes.Structure):
    """One decoder layer of ``infer_bf16_decode_layers`` (the C ``infer_bf16_layer``): float32
    norm weights, the four projections pair-packed, the float32 qkv bias (or NULL) and the
    layer's bf16 KV caches."""

    _fields_ = [("in_norm", _P), ("post_norm", _P), ("wqkv", _P), ("wo", _P), ("wgu", _P),
                ("wdown", _P), ("bqkv", _P), ("k_cache", _P), ("v_cache", _P)]


class Screen(ctypes.Structure):
    """The greedy head's int8 screen (the C ``infer_bf16_screen``; ``pack_screen`` builds it)."""

    _fields_ = [("q", _P), ("scale", _P), ("qsum", _P), ("err", _P), ("qnorm", _P),
                ("wnorm", _P), ("rows", _P), ("K", _I)]


SIGNATURES = {
    "infer_bf16_set_threads": [_I],
    "infer_bf16_isa": [],
    "infer_bf16_gemm": [_P, _I, _L, _I, _I, _P, _P, _I, _P, _I, _L],
    "infer_bf16_decode_layers": [ctypes.POINTER(Layer), _I, _P, _I, _I, _I, _I, _I, _I, _F, _P,
                                 _P, _I, _P, _P, _L, _P, _I, _F, _I, _P, _F, _P, _I, _P, _P, _P],
    "infer_bf16_forward_layers": [ctypes.POINTER(Layer), _I, _P, _I, _I, _I, _I, _I, _I, _F, _P,
                                  _P, _I, _P, _P, _L, _P, _P, _I, _I, _F, _I, _P, _F, _P, _I, _P,
                                  _I, _P, _P, _P],
    "infer_bf16_rms_norm": [_P, _L, _I, _P, _L, _P, _P, _I, _P, _I, _I, _F],
    "infer_bf16_rope": [_P, _P, _L, _I, _P, _L, _I, _I, _I, _I, _P],
    "infer_bf16_silu_mul": [_P, _L, _P, _I, _I],
    "infer_bf16_add": [_P, _P, _P, _L, _I],
    "infer_bf16_prefill_attention": [_P, _L, _P, _L, _P, _L, _P, _P, _P, _I, _P, _L, _P, _P, _I,
                                     _I, _I, _I, _I, _F, _P],
    "infer_bf16_pool_swaps": [_I],
    "infer_bf16_screen_ok": [],
    "infer_bf16_screen_stats": [_P],
}

_lock = threading.Lock()
_state: dict[str, object] = {}
_threads = [0]


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of the library's functions."""
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = _I if name in ("infer_bf16_isa", "infer_bf16_pool_swaps",
                                    "infer_bf16_screen_ok") else None
    lib.infer_bf16_pool_swaps(pool_swap_setting())
    return lib


def load() -> ctypes.CDLL | None:
    """The compiled library (built on first call), or None with the reason in ``detail()``."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]  # type: ignore[return-value]
        lib, detail = None, ""
        if disabled():
            detail = "disabled by INFER_CPU_KERNELS=0"
        elif (cc := compiler()) is None:
            detail = "no C compiler (cc/gcc/clang) on PATH; bf16 layers use torch"
        else:
            try:
                path, flags = build(cc, BF16_SOURCE, BF16_LIB_NAME)
                lib = bind(ctypes.CDLL(str(path)))
                detail = f"{path} ({cc} {' '.join(flags)}; {ISA_NAMES[lib.infer_bf16_isa()]})"
            except (OSError, RuntimeError, AttributeError) as e:
                lib, detail = None, f"could not build the bf16 kernels: {e}"
                logger.warning("%s; bf16 layers use torch", detail)
        _state["lib"], _state["detail"] = lib, detail
        return lib


def detail() -> str:
    load()
    return str(_state.get("detail", ""))


def isa() -> str | None:
    """The ISA path the library was compiled with, or None without the library."""
    lib = load()
    return ISA_NAMES[lib.infer_bf16_isa()] if lib is not None else None


_call_threads = [0]  # set_call_threads' count; 0: torch's


def set_call_threads(n: int) -> None:
    """The thread count of the per-op kernels' calls from now on (0: torch's thread count)."""
    _call_threads[0] = max(0, n)


def lib_for_call() -> ctypes.CDLL | None:
    """The library with its work pool sized to ``set_call_threads``' count, else torch's."""
    lib = _state["lib"] if "lib" in _state else load()
    if lib is not None:
        n = _call_threads[0] or torch.get_num_threads()
        if n != _threads[0]:
            lib.infer_bf16_set_threads(n)
            _threads[0] = n
    return lib  # type: ignore[return-value]


class ThreadChoice:
    """A thread count per size class (powers of two: the decode batch, or a step's tokens): the
    candidate (1 or ``max_threads``) with the lower moving average of measured step time, and
    now and then the other one. On a shared machine a thread that another process keeps off its
    core holds up every job it has taken, so one thread can be the faster. ``fixed`` > 0 always
    answers that count. ``max_first``: measure ``max_threads`` first and the other only after
    ``explore`` more steps of the class (large jobs, such as a prefill, where an early call on one
    thread is a request's time to first token at twice the usual: a server's second prompt of a
    size should not be the slow one).

    Exploring: the other candidate now and then, so that a class spends about 1 / (4 x
    ``explore``) of its time on it. An exploring step costs the other's extra time (ratio - 1
    best steps), so it comes every 4 x ``explore`` x (ratio - 1) steps, rounded, at least every
    ``explore``-th and at most every 16 x ``explore``-th. (On a quiet 2-core machine one thread
    takes 1.6x as long at batch 32: exploring it every 16th step cost 3.75 % of the decode rate,
    every 38th costs 1.6 %.) An exploring
    step's time replaces that candidate's average instead of joining it: the average may be
    stale (measured under a load that has gone), and one step tells. A load that appears shows
    in the best candidate's own steps, which are measured every time.

    The best candidate changes only when the other's average is below ``switch`` times its own
    (0.9): one exploring step that happened to be quick on a noisy machine does not move a
    class to the slower count for the ``explore`` steps until the next look. (Before this, a
    32-row bf16 decode ran 39 of 240 steps on one thread, 49.6 ms against 38.9 ms on two, in one
    ``benchmarks/cpu_engine_steps.py`` run: 2.7 % of its time.)

    Once the other has had ``looks`` steps, a class that runs on more threads than the other
    explores it only while it could win: while its fastest step so far is below ``switch`` times
    the best's average. One thread wins only when a load slows the threads down, and that shows
    in the best's own average first; on a quiet machine every exploring step was lost time, and
    for a prefill class a request's time to first token at almost twice the usual (a 128-token
    bf16 prompt: 73 ms on one thread against 40 on two, every 51st prompt of the size). A class
    that runs on fewer threads goes on exploring as above: the load that made it faster may have
    gone, and that shows only in the other's steps."""

    switch = 0.9
    looks = 2

    def __init__(self, max_threads: int, fixed: int = 0, explore: int = 16,
                 max_first: bool = False) -> None:
        self.candidates = [1] if max_threads <= 1 else [1, max_threads]
        if max_first:
            self.candidates.reverse()
        self.max_first = max_first
        self.fixed, self.explore = fixed, explore
        self._avg: dict[tuple[int, int], float] = {}  # (class, threads) -> seconds per step
        self._since: dict[int, int] = {}  # steps of a class since its last exploring step
        self._exploring: dict[int, int] = {}  # class -> the candidate its current step explores
        self._best: dict[int, int] = {}  # class -> the candidate it runs (once both measured)
        self._min: dict[tuple[int, int], float] = {}  # (class, threads) -> its fastest step
        self._looks: dict[tuple[int, int], int] = {}  # (class, threads) -> steps measured

    def pick(self, batch: int) -> int:
        if self.fixed > 0:
            return self.fixed
        c = batch.bit_length()
        untried = [t for t in self.candidates if (c, t) not in self._avg]
        if untried:
            if self.max_first and len(untried) < len(self.candidates):
                since = self._since[c] = self._since.get(c, 0) + 1
                if since <= self.explore:
                    return self.candidates[0]
                self._since[c] = 0
            return untried[0]
        best = self._best.get(c)
        if best is None:  # both just measured: the faster
            best = min(self.candidates, key=lambda t: self._avg[(c, t)])
        other = next((t for t in self.candidates if t != best), best)
        if self._avg[(c, other)] < self.switch * self._avg[(c, best)]:
            best, other = other, best
        self._best[c] = best
        ratio = self._avg[(c, other)] / max(self._avg[(c, best)], 1e-12)
        since = self._since[c] = self._since.get(c, 0) + 1
        every = min(16 * self.explore, max(self.explore, round(4 * self.explore * (ratio - 1))))
        if other != best and since >= every and self._worth_a_look(c, best, other):
            self._since[c] = 0
            self._exploring[c] = other
            return other
        return best

    def _worth_a_look(self, c: int, best: int, other: int) -> bool:
        """Whether class c, running ``best`` threads, should explore ``other`` (see above)."""
        if best < other or self._looks.get((c, other), 0) < self.looks:
            return True
        return self._min[(c, other)] < self.switch * self._avg[(c, best)]

    def record(self, batch: int, threads: int, seconds: float) -> None:
        c = batch.bit_length()
        key, old = (c, threads), self._avg.get((c, threads))
        self._min[key] = min(seconds, self._min.get(key, seconds))
        self._looks[key] = self._looks.get(key, 0) + 1
        if self._exploring.pop(c, None) == threads or old is None:
            self._avg[key] = seconds
        else:
            self._avg[key] = 0.75 * old + 0.25 * seconds


@dataclass
class PackedBF16:
    """W [N, K] bf16 pair-packed: ``data`` [ceil(N / 16), ceil(K / 2), 16, 2] bf16, zero padded
    (column block b, k pair j: the 16 columns' (w[n, 2j], w[n, 2j + 1]))."""

    data: torch.Tensor
    out_features: int
    in_features: int

    def unpack(self) -> torch.Tensor:
        """The dense weight [N, K] bf16 back (exact)."""
        nb, k2 = self.data.shape[:2]
        w = self.data.permute(0, 2, 1, 3).reshape(nb * BLOCK, k2 * 2)
        return w[:self.out_features, :self.in_features].contiguous()


class ScreenData:
    """The int8 copy of an LM head [V, K] that ``infer_bf16_decode_layers`` /
    ``infer_bf16_forward_layers`` screen greedy rows with (see the C file's "greedy LM head"):
    per column n the scale s_n = max|W_n| / 127 and codes q_n = rint(W_n / s_n), packed
    [ceil(V / 16), K / 4, 16, 4], and the bound's column terms, computed in float64 and rounded
    up: 128 sum(q_n), ||W_n - s_n q_n||, s_n ||q_n||, ||W_n||; and W itself in bf16, row-major
    (``w`` when it is already that: a bf16 model's tied embedding, no copy), which the
    candidates' exact dots read. ``struct`` is the C view."""

    def __init__(self, w: torch.Tensor) -> None:
        from infer_cpu.kernels import ColumnCodes

        k = w.shape[1]
        if k % 4:
            raise ValueError(f"the screen needs K a multiple of 4, not {k}")
        self.rows = w.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()
        cols = ColumnCodes.of(self.rows, 128)  # the u8 activation codes' offset
        self.codes, self.scale, self.qsum = cols.codes, cols.scale, cols.csum
        self.err, self.qnorm, self.wnorm = cols.err, cols.qnorm, cols.wnorm
        self.struct = Screen(*cols.pointers(), self.rows.data_ptr(), k)


def pack(w: torch.Tensor) -> PackedBF16:
    """w [N, K] (any float dtype, rounded to bf16) -> its pair-packed copy."""
    n, k = w.shape
    nb, k2 = -(-n // BLOCK), -(-k // 2)
    padded = torch.zeros(nb * BLOCK, k2 * 2, dtype=torch.bfloat16)
    padded[:n, :k] = w.detach().to(device="cpu", dtype=torch.bfloat16)
    data = padded.reshape(nb, BLOCK, k2, 2).permute(0, 2, 1, 3).contiguous()
    return PackedBF16(data, n, k)


_FLOATS = (torch.float32, torch.bfloat16)


def gemm(x: torch.Tensor, w: PackedBF16, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """x [M, K] float32 or bf16 (unit column stride) -> [M, N] in ``out_dtype`` (default x's),
    activations rounded to bf16; None when the inputs do not fit the kernel."""
    lib = lib_for_call()
    out_dtype = out_dtype or x.dtype
    if (lib is None or x.dim() != 2 or x.dtype not in _FLOATS or out_dtype not in _FLOATS
            or x.shape[1] != w.in_features or x.stride(1) != 1 or x.device.type != "cpu"):
        return None
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()
                             or bias.device.type != "cpu" or bias.shape != (w.out_features,)):
        return None
    m = x.shape[0]
    y = torch.empty(m, w.out_features, dtype=out_dtype)
    if m == 0:
        return y
    lib.infer_bf16_gemm(x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0), m,
                        w.in_features, w.data.data_ptr(),
                        bias.data_ptr() if bias is not None else None, w.out_features,
                        y.data_ptr(), int(out_dtype == torch.bfloat16), w.out_features)
    return y


# -- layer ops of bf16 models (registered for the CPU; float32-only inputs go to the float32
# kernels of infer_cpu.kernels, anything else that does not fit returns None: the reference) --

_BF = torch.bfloat16


def _rows(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1 and t.dtype in _FLOATS and t.device.type == "cpu"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``layer_ops.rms_norm`` for bf16 x and/or a bf16 weight (rounded where the reference
    rounds); float32 x and weight go to ``infer_cpu.kernels.rms_norm``."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        from infer_cpu import kernels

        return kernels.rms_norm(x, weight, eps, residual)
    lib = lib_for_call()
    if (lib is None or not _rows(x) or weight.dtype not in _FLOATS or weight.device.type != "cpu"
            or not weight.is_contiguous() or weight.shape != (x.shape[1],)):
        return None
    if residual is not None and (not _rows(residual) or residual.dtype != x.dtype
                                 or residual.shape != x.shape):
        return None
    rows, dim = x.shape
    out_dtype = _BF if x.dtype == _BF and weight.dtype == _BF else torch.float32
    out = torch.empty(rows, dim, dtype=out_dtype)
    res_out = torch.empty(rows, dim, dtype=x.dtype) if residual is not None else None
    lib.infer_bf16_rms_norm(x.data_ptr(), x.stride(0), int(x.dtype == _BF),
                            residual.data_ptr() if residual is not None else None,
                            residual.stride(0) if residual is not None else 0,
                            res_out.data_ptr() if res_out is not None else None,
                            weight.data_ptr(), int(weight.dtype == _BF), out.data_ptr(), rows, dim,
                            float(eps))
    return out, res_out


def _bf16_heads(t: torch.Tensor) -> bool:
    """[T, heads, D] bf16 on the CPU with contiguous heads (the row stride may be larger)."""
    return (t.dtype == _BF and t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]
            and t.device.type == "cpu")


def rope_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
          rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``layer_ops.rotary`` for bf16 q/k, in place; float32 goes to ``infer_cpu.kernels.rope_``."""
    if q.dtype == torch.float32:
        from infer_cpu import kernels

        return kernels.rope_(positions, q, k, cos_sin, rotary_dim)
    lib = lib_for_call()
    if (lib is None or not _bf16_heads(q) or not _bf16_heads(k) or positions.dtype != torch.int64
            or not positions.is_contiguous() or positions.device.type != "cpu"
            or cos_sin.dtype != torch.float32 or not cos_sin.is_contiguous()
            or cos_sin.device.type != "cpu" or cos_sin.shape[1] != rotary_dim
            or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[0] != len(positions)
            or rotary_dim > q.shape[2] or rotary_dim % 2):
        return None
    t, h, d = q.shape
    lib.infer_bf16_rope(positions.data_ptr(), q.data_ptr(), q.stride(0), h, k.data_ptr(),
                        k.stride(0), k.shape[1], t, d, rotary_dim, cos_sin.data_ptr())
    return q, k


def silu_mul(x: torch.Tensor) -> torch.Tensor | None:
    """``layer_ops.silu_and_mul`` for bf16 x [T, 2I]; float32 goes to ``infer_cpu.kernels``."""
    if x.dtype == torch.float32:
        from infer_cpu import kernels

        return kernels.silu_mul(x)
    lib = lib_for_call()
    if lib is None or x.dtype != _BF or not _rows(x) or x.shape[1] % 2:
        return None
    t, i = x.shape[0], x.shape[1] // 2
    out = torch.empty(t, i, dtype=_BF)
    lib.infer_bf16_silu_mul(x.data_ptr(), x.stride(0), out.data_ptr(), t, i)
    return out


def residual_add(h: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """``layer_ops.residual_add`` for contiguous CPU tensors of one shape, both bf16 or both
    float32, on the kernels' work pool (no OpenMP region, whose closing barrier waits for a
    thread another process keeps off its core); the same bits as torch's add."""
    if (h.dtype not in _FLOATS or x.dtype != h.dtype or h.shape != x.shape or h.device.type != "cpu"
            or x.device.type != "cpu" or not (h.is_contiguous() and x.is_contiguous())):
        return None
    lib = lib_for_call()
    if lib is None:
        return None
    out = torch.empty_like(h)
    lib.infer_bf16_add(h.data_ptr(), x.data_ptr(), out.data_ptr(), h.numel(), int(h.dtype == _BF))
    return out


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, ext_lens: torch.Tensor, page_size: int,
                    scale: float) -> torch.Tensor | None:
    """Write bf16 k/v [T, Hkv, D] at ``slots`` of the bf16 caches [P, page, Hkv, D], then attend
    q [T, H, D] (bf16): sequence i's ``ext_lens[i]`` query rows (packed in order) sit at the last
    positions of its ``seq_lens[i]`` keys and each sees the keys up to its own position. Returns
    [T, H, D] bf16, or None when the inputs do not fit the kernel."""
    lib = lib_for_call()
    if (lib is None or not (_bf16_heads(q) and _bf16_heads(k) and _bf16_heads(v))
            or k_cache.dtype != _BF or v_cache.dtype != _BF
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())
            or k_cache.shape != v_cache.shape or k_cache.dim() != 4
            or tuple(k_cache.shape[2:]) != tuple(k.shape[1:]) or k.shape != v.shape
            or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]
            or q.shape[0] != k.shape[0] or slots.shape != (q.shape[0],)
            or slots.dtype != torch.int64 or block_tables.dtype != torch.int32
            or seq_lens.dtype != torch.int32 or ext_lens.dtype != torch.int32
            or block_tables.dim() != 2 or block_tables.stride(1) != 1
            or not (slots.is_contiguous() and seq_lens.is_contiguous() and ext_lens.is_contiguous())
            or len(seq_lens) != len(ext_lens) or len(seq_lens) != block_tables.shape[0]
            or any(t.device.type != "cpu" for t in (k_cache, v_cache, slots, block_tables,
                                                    seq_lens, ext_lens))
            or int(ext_lens.sum()) != q.shape[0] or bool((seq_lens < ext_lens).any())):
        return None
    t, h, d = q.shape
    out = torch.empty(t, h, d, dtype=_BF)
    if t == 0:
        return out
    lib.infer_bf16_prefill_attention(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0),
                                     v.data_ptr(), v.stride(0), k_cache.data_ptr(),
                                     v_cache.data_ptr(), slots.data_ptr(), t,
                                     block_tables.data_ptr(), block_tables.stride(0),
                                     seq_lens.data_ptr(), ext_lens.data_ptr(), len(seq_lens), h,
                                     k.shape[1], d, page_size, float(scale), out.data_ptr())
    return out
