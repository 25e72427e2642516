"""``infer_qgemm`` (the CPU plugin's int8-activation GEMM on GGUF blocks) on the default model's
layer shapes, against torch's float32 matmul on the dequantized weights.

The shapes and the weights are layer 0 of the GGUF (fused as the model runs them: qkv = q|k|v
rows, gate_up = gate|up rows). Each M (activation rows: the batch in decode, the prompt in
prefill) is timed for the working tree's kernels and, with ``--compare``, for other versions of
``infer_cpu_kernels.c`` built the same way, in alternating rounds, so before/after numbers come
from one run on a shared machine. Prints the best time per call, GMAC/s (M * N * K / t) and the
tree's speed-up over each other entry ("tree 2.50x HEAD": the tree takes 1 / 2.5 of the time).

    python benchmarks/cpu_qgemm_micro.py --compare HEAD~1            # a git revision
    python benchmarks/cpu_qgemm_micro.py --compare /tmp/old.c -m 1 32  # a file
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CPU plugin runs (shared cores)

import gguf  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from infer.core.model.loader.default_model import ensure_default_model  # noqa: E402
from infer_cpu import kernels  # noqa: E402
from infer_cpu.native_build import FLAG_SETS, SOURCE, compiler  # noqa: E402
from infer_cpu.quant.packing import KIND_I8, KIND_I16, Q, QWeight, gguf_qweight, quantize_q8_blocks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FUSED = {"qkv": ["attn_q", "attn_k", "attn_v"], "o": ["attn_output"],
         "gate_up": ["ffn_gate", "ffn_up"], "down": ["ffn_down"]}


def fused_layer(tensors: dict, layer: int) -> dict[str, QWeight]:
    """The four projections of block ``layer`` (``tensors``: the GGUF's by name) as the native
    kernels take them."""
    out = {}
    for name, parts in FUSED.items():
        ts = [tensors[f"blk.{layer}.{p}.weight"] for p in parts]
        if len({t.tensor_type for t in ts}) != 1:
            raise SystemExit(f"{name}: parts of mixed block types {[t.tensor_type.name for t in ts]}")
        raw = torch.cat([torch.from_numpy(t.data.copy()) for t in ts])  # [N, bytes per row]
        out[name] = gguf_qweight(raw, Q(ts[0].tensor_type), raw.shape[0])
    return out


def layer0(path: Path) -> dict[str, QWeight]:
    """The four projections of block 0 as the native kernels take them."""
    return fused_layer({t.name: t for t in gguf.GGUFReader(path).tensors}, 0)


def lm_head_q8(path: Path) -> QWeight:
    """The tied LM head as the plugin serves it: the embedding quantized to Q8_0 blocks."""
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    rows = int(t.shape[-1])
    dense = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(rows, -1)
    return quantize_q8_blocks(dense.float())


def revision_kernels(rev: str, tmp: Path) -> Path:
    """The CPU plugin's kernel sources (every .c and .h) at git revision ``rev``, written into a
    folder of ``tmp``, which is returned."""
    rel = SOURCE.resolve().parent.relative_to(REPO)
    out = tmp / rev.replace("/", "_").replace("~", "_")
    out.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{rev}:{rel}"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith((".c", ".h")):
            (out / name).write_bytes(subprocess.run(
                ["git", "-C", str(REPO), "show", f"{rev}:{rel}/{name}"], check=True,
                capture_output=True).stdout)
    return out


def build_other(spec: str, tmp: Path) -> ctypes.CDLL:
    """A kernels library from a .c file (with the working tree's headers) or from a git revision
    of the plugin's source (with that revision's headers: the attention is in one)."""
    src, include = Path(spec), SOURCE.parent
    if not src.is_file():
        include = revision_kernels(spec, tmp)
        src = include / SOURCE.name
    cc = compiler()
    if cc is None:
        raise SystemExit("no C compiler on PATH")
    lib_path = tmp / f"lib_{abs(hash(spec))}.so"
    subprocess.run([cc, *FLAG_SETS[0], "-shared", "-fPIC", "-I", str(include), "-o",
                    str(lib_path), str(src), "-lm"], check=True)  # -I: the kernels' headers
    lib = ctypes.CDLL(str(lib_path))
    for name, argtypes in kernels._SIGNATURES.items():
        if hasattr(lib, name):  # an older source may lack newer kernels (and have others)
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = None
    return lib


def tree_and_others(specs: list[str], tmp: Path) -> tuple[dict[str, ctypes.CDLL], int]:
    """{"tree": the working tree's kernels, spec: each other version}, every team sized to
    torch's thread count, and that count."""
    tree = kernels.load()
    if tree is None:
        raise SystemExit(f"native kernels unavailable: {kernels.status().detail}")
    threads = torch.get_num_threads()
    libs = {"tree": tree} | {spec: build_other(spec, tmp) for spec in specs}
    for lib in libs.values():
        lib.infer_set_threads(threads)
    return libs, threads


def qgemm_call(lib: ctypes.CDLL, x: torch.Tensor, w: QWeight, y: torch.Tensor):
    args = (w.kind, x.data_ptr(), x.stride(0), x.shape[0], w.in_features, 0, w.blocks.data_ptr(),
            None, w.out_features, y.data_ptr(), w.out_features)
    return lambda: lib.infer_qgemm(*args)


def fgemm_call(lib: ctypes.CDLL, x: torch.Tensor, w: QWeight, y: torch.Tensor, flag: int = 0):
    """``infer_fgemm`` (the serving GEMM); ``flag`` = ``KIND_I8`` / ``KIND_I16``: its int8 / int16
    activation paths."""
    args = (w.kind | flag, x.data_ptr(), x.stride(0), x.shape[0], w.in_features,
            w.blocks.data_ptr(), None, w.out_features, y.data_ptr(), w.out_features)
    return lambda: lib.infer_fgemm(*args)


_TILES: dict[int, torch.Tensor] = {}


def fgemm_tiles_call(lib: ctypes.CDLL, x: torch.Tensor, w: QWeight, y: torch.Tensor):
    """``infer_fgemm_tiles`` on int16 activations with the tiles packed at load, as the default
    model serves its projections (packed once by the tree's kernels; every version reads the same
    layout)."""
    if id(w) not in _TILES:
        packed = kernels.with_tiles(w.with_activations("int16")).tiles
        if packed is None:
            raise SystemExit("this build packs no int16 tiles")
        _TILES[id(w)] = packed
    args = (w.kind | KIND_I16, x.data_ptr(), x.stride(0), x.shape[0], w.in_features,
            w.blocks.data_ptr(), _TILES[id(w)].data_ptr(), None, w.out_features, y.data_ptr(),
            w.out_features)
    return lambda: lib.infer_fgemm_tiles(*args)


KERNELS = {"qgemm": qgemm_call, "fgemm": fgemm_call,
           "fgemm-i8": lambda lib, x, w, y: fgemm_call(lib, x, w, y, KIND_I8),
           "fgemm-i16": lambda lib, x, w, y: fgemm_call(lib, x, w, y, KIND_I16),
           "fgemm-i16-tiles": fgemm_tiles_call}


def loadavg() -> str:
    """1 / 5 / 15-minute load average (the machine is shared)."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def best_time(fn, budget_s: float) -> float:
    """Best seconds per call over batches of calls filling about ``budget_s``."""
    fn()
    t0 = time.perf_counter()
    fn()
    per = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(budget_s / 5 / per))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="append", default=[],
                    help="another infer_cpu_kernels.c: a file or a git revision (repeatable)")
    ap.add_argument("-m", "--rows", type=int, nargs="+", default=[1, 4, 32, 128])
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best is kept")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per timing")
    ap.add_argument("--no-torch", action="store_true", help="skip the float32 matmul peer")
    ap.add_argument("--kernel", choices=list(KERNELS), nargs="+", default=["qgemm"],
                    help="qgemm (int8 activations, unused by serving), fgemm (float32 activations), "
                         "fgemm-i8 / fgemm-i16 (fgemm's batch-invariant int8 / int16 activations), "
                         "fgemm-i16-tiles (int16 on tiles packed at load, as the default serves); "
                         "several: each timed in the same rounds, the first is the ratios' base")
    ap.add_argument("--lm-head", action="store_true",
                    help="also the Q8_0 LM head (the embedding quantized as the model serves it)")
    args = ap.parse_args()

    weights = layer0(ensure_default_model())
    with tempfile.TemporaryDirectory() as tmp:
        libs, threads = tree_and_others(args.compare, Path(tmp))
        dense = {name: w.dequantize() for name, w in weights.items()}
        if args.lm_head:
            weights["lm_head"] = lm_head_q8(ensure_default_model())
            dense["lm_head"] = weights["lm_head"].dequantize()
        print(f"{' '.join(args.kernel)}: threads {threads}, load {loadavg()}; best of {args.rounds} "
              f"rounds; GMAC/s = M*N*K/t")
        base = "tree" if len(args.kernel) == 1 else f"tree {args.kernel[0]}"
        for name, w in weights.items():
            n, k = w.out_features, w.in_features
            for m in args.rows:
                x = torch.randn(m, k)
                y = torch.empty(m, n)
                fns = {(label if len(args.kernel) == 1 else f"{label} {kernel}"):
                       KERNELS[kernel](lib, x, w, y) for kernel in args.kernel
                       for label, lib in libs.items()
                       if label == "tree" or kernel == "qgemm" or hasattr(lib, "infer_fgemm")}
                if not args.no_torch:
                    fns["torch f32"] = lambda x=x, wd=dense[name]: F.linear(x, wd)
                best = dict.fromkeys(fns, float("inf"))
                for _ in range(args.rounds):
                    for label, fn in fns.items():
                        best[label] = min(best[label], best_time(fn, args.budget))
                cells = [f"{label} {best[label] * 1e6:8.1f} us {m * n * k / best[label] / 1e9:6.1f}"
                         for label in fns]
                ratios = [f"{base} {best[label] / best[base]:.2f}x {label}" for label in fns
                          if label != base]
                print(f"{name:7s} N={n:4d} K={k:4d} M={m:3d} | " + " | ".join(cells)
                      + (" | " + ", ".join(ratios) if ratios else ""))
        print(f"load {loadavg()}")


if __name__ == "__main__":
    main()
