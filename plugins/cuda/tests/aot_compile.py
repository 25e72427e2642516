"""Compile every Triton kernel of the plugin for real GPU targets, without a GPU.

Run as a script (``python aot_compile.py``) with TRITON_INTERPRET unset: the interpreter replaces
``@triton.jit`` functions, and what is checked here is the compiler's path (Triton IR -> PTX ->
cubin through the bundled ptxas), which the interpreter never takes. Prints one JSON object per
(kernel, variant, target): whether it compiled, its shared memory, and the atomics and L2-only
loads in its PTX (the single-launch reductions depend on those). The test module
``test_compile_targets.py`` runs it and checks the results.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGETS = {"sm80": 80, "sm90": 90}


def _signature(fn: Any, pointers: dict[str, str], scalars: dict[str, str],
               consts: dict[str, Any]) -> dict[str, str]:
    """Every parameter typed: pointers as given, constexprs, named float scalars, other ints."""
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in consts:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = "*" + pointers[name]
        else:
            sig[name] = scalars.get(name, "i32")
    return sig


def _cases() -> Iterator[tuple[str, Any, dict, dict, dict, dict, tuple[str, ...]]]:
    """(name, kernel, pointer dtypes, scalar types, constexprs, options, targets)."""
    from infer_cuda.kernels import decode_attention as da
    from infer_cuda.kernels import gemv
    from infer_cuda.kernels.extend_attention import _extend_kernel
    from infer_cuda.kernels.fused_moe import _moe_gemm_kernel
    from infer_cuda.kernels.kv_store import _rope_store_kernel, _store_kv_kernel

    # every config for the H100 (sm90), where they are timed against each other; one of each
    # kind for sm80; fp8 caches need sm89+
    both, hopper = tuple(TARGETS), ("sm90",)
    attn_scalars = {"sm_scale_log2": "fp32", "k_scale": "fp32", "v_scale": "fp32"}
    for kv, scaled, targets in (("bf16", False, both), ("fp8e4nv", True, hopper)):
        ptrs = {n: "bf16" for n in ("Q", "Out", "K", "V")} | {"K": kv, "V": kv}
        ptrs |= {"BlockTables": "i32", "SeqLens": "i32", "OPart": "fp32", "LsePart": "fp32",
                 "Counters": "i32"}
        for i, (bn, warps, stages, fused) in enumerate(da._CONFIGS):
            first_of_kind = i == 0 or fused != da._CONFIGS[i - 1][3]
            consts = dict(PAGE_SIZE=16, GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128,
                          BLOCK_N=bn, NUM_SPLITS=64, KV_SCALED=scaled, DOT_PREC="tf32",
                          DOT_F32=False, FUSED_MERGE=fused)
            yield (f"decode_split kv={kv} bn={bn} w={warps} s={stages} fused={fused}",
                   da._decode_split_kernel, ptrs, attn_scalars, consts,
                   dict(num_warps=warps, num_stages=stages), targets if first_of_kind else hopper)
        ext_ptrs = ptrs | {"QueryStart": "i32", "PrefixLens": "i32"}
        yield (f"extend kv={kv}", _extend_kernel, ext_ptrs, attn_scalars,
               dict(PAGE_SIZE=16, GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64,
                    KV_SCALED=scaled, DOT_PREC="tf32", DOT_F32=False),
               dict(num_warps=4, num_stages=2), targets)
        store_ptrs = {"K": "bf16", "V": "bf16", "KCache": kv, "VCache": kv, "SlotMapping": "i64"}
        yield (f"store_kv kv={kv}", _store_kv_kernel, store_ptrs,
               {"inv_k_scale": "fp32", "inv_v_scale": "fp32"},
               dict(ROW=1024, BLOCK=1024, SCALED=scaled, QMAX=448.0), dict(num_warps=4), targets)
        rope_ptrs = store_ptrs | {"Q": "bf16", "QOut": "bf16", "Positions": "i64",
                                  "CosSin": "fp32"}
        for rot in (128, 64):  # full and partial rotary
            yield (f"rope_store kv={kv} rot={rot}", _rope_store_kernel, rope_ptrs,
                   {"inv_k_scale": "fp32", "inv_v_scale": "fp32"},
                   dict(NUM_HEADS=32, NUM_KV_HEADS=8, BLOCK_H=32, BLOCK_HKV=8, HEAD_DIM=128,
                        BLOCK_D=128, ROT=rot, SCALED=scaled, QMAX=448.0),
                   dict(num_warps=4), targets)
    yield ("decode_merge", da._decode_merge_kernel, {"OPart": "fp32", "LsePart": "fp32",
                                                     "Out": "bf16"}, {},
           dict(HEAD_DIM=128, BLOCK_D=128, NUM_SPLITS=64, BLOCK_S=64), dict(num_warps=4), both)
    yield ("moe_gemm", _moe_gemm_kernel,
           {"A": "bf16", "B": "bf16", "C": "bf16", "SortedPairs": "i32", "BlockExpert": "i32",
            "TopkW": "fp32"}, {},
           dict(NUM_EXPERTS=8, A_ROW_DIV=2, MUL_WEIGHT=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                DOT_PREC="tf32", DOT_F32=False), dict(num_warps=4, num_stages=3), both)
    gemv_ptrs = {"X": "bf16", "W": "bf16", "Bias": "bf16", "Y": "bf16", "Part": "fp32",
                 "Counters": "i32", "WScale": "fp32"}
    for i, (bn, bk, split, warps, stages) in enumerate(gemv.CONFIGS):
        first_of_kind = i == 0 or split != gemv.CONFIGS[i - 1][2]
        for bm in (1, 8):
            yield (f"gemv m={bm} bn={bn} bk={bk} split={split} w={warps} s={stages}",
                   gemv._gemv_kernel, gemv_ptrs, {},
                   dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, EVEN_N=True,
                        EVEN_K=True, HAS_BIAS=bm == 8, NUM_STAGES=stages, W_SCALED=False),
                   dict(num_warps=warps, num_stages=stages),
                   both if first_of_kind and bm == 1 else hopper)
        # fp8 weights with per-channel scales (--quantization fp8, sm89+)
        yield (f"gemv fp8 m=1 bn={bn} bk={bk} split={split} w={warps} s={stages}",
               gemv._gemv_kernel, gemv_ptrs | {"W": "fp8e4nv"}, {},
               dict(BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, EVEN_N=True, EVEN_K=True,
                    HAS_BIAS=False, NUM_STAGES=stages, W_SCALED=True),
               dict(num_warps=warps, num_stages=stages), hopper)


def main() -> int:
    names = set(sys.argv[1:])
    for name, fn, ptrs, scalars, consts, options, targets in _cases():
        if names and not any(name.startswith(n) for n in names):
            continue
        for target in targets:
            row: dict[str, Any] = {"kernel": name, "target": target}
            try:
                src = ASTSource(fn=fn, signature=_signature(fn, ptrs, scalars, consts),
                                constexprs=consts)
                k = triton.compile(src, target=GPUTarget("cuda", TARGETS[target], 32),
                                   options=options)
                ptx = k.asm["ptx"]
                row.update(ok=True, shared=k.metadata.shared,
                           atomics=sorted(set(re.findall(r"atom\.[\w.]+", ptx))),
                           l2_loads=len(re.findall(r"ld\.global\.cg", ptx)))
            except Exception as e:  # reported, the test fails on it
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
