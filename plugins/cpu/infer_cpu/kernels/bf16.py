"""The bf16 kernels (``infer_cpu_bf16.c``): a GEMM on pair-packed bf16 weights and the whole
bf16 decode step, compiled on first use like ``infer_cpu_kernels.c`` (see ``native_build``) into
a library of their own and called via ctypes.

ISA paths, chosen when the library is compiled for this CPU: AVX-512 BF16 (``vdpbf16ps``),
AVX2 + FMA (weights widened to float32), portable C. AMX tiles are not used: a CPU with AMX also
has AVX-512 BF16 and runs that path. ``isa()`` says which one was built.

The wrappers check what the kernels assume (dtypes, strides, CPU tensors) and return None when
a call does not fit, so the caller runs the torch reference instead.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import torch

from infer_cpu.native_build import BF16_LIB_NAME, BF16_SOURCE, build, compiler, disabled

logger = logging.getLogger(__name__)

BLOCK = 16  # output columns per packed block
ISA_NAMES = {3: "avx512_bf16", 2: "avx2", 0: "portable C"}

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


SIGNATURES = {
    "infer_bf16_set_threads": [_I],
    "infer_bf16_isa": [],
    "infer_bf16_gemm": [_P, _I, _L, _I, _I, _P, _P, _I, _P, _I, _L],
    "infer_bf16_decode_layers": [ctypes.POINTER(Layer), _I, _P, _I, _I, _I, _I, _I, _I, _F, _P,
                                 _P, _I, _P, _P, _L, _P, _I, _F],
}

_lock = threading.Lock()
_state: dict[str, object] = {}
_threads = [0]


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of the library's functions."""
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = _I if name == "infer_bf16_isa" else None
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


def lib_for_call() -> ctypes.CDLL | None:
    """The library with its OpenMP team sized to torch's current thread count."""
    lib = _state["lib"] if "lib" in _state else load()
    if lib is not None:
        n = torch.get_num_threads()
        if n != _threads[0]:
            lib.infer_bf16_set_threads(n)
            _threads[0] = n
    return lib  # type: ignore[return-value]


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
