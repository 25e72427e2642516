"""Paged decode attention (``infer_paged_decode``) and the LM head (``infer_fgemm`` on Q8_0) of the CPU
plugin on the default model's shapes, for the working tree's kernels and, with ``--compare``,
other versions of ``infer_cpu_kernels.c``, in alternating rounds on the same inputs.

Attention: 9 query heads over 3 KV heads of 64 dims, every sequence ``--seq-len`` positions long,
cycling over 30 layers' caches (as a decode step does, so the keys come from memory, not from
cache). With page size 1 a sequence's prompt sits in consecutive slots and its generated tokens
are interleaved with the other sequences' (as the engine allocates them); larger pages are
scattered. LM head: 49152 x 576 Q8_0 rows against M float32 activation rows.

    python benchmarks/cpu_attn_micro.py --compare HEAD
    python benchmarks/cpu_attn_micro.py --compare /tmp/old.c -b 32 --page 1 16 --no-lm-head
    python benchmarks/cpu_attn_micro.py --kv float32 fp16 bf16 -b 32 --page 16 --no-lm-head
    python benchmarks/cpu_attn_micro.py --compare HEAD --compare-16-bit --kv fp16 -b 8 32 --page 1 --no-lm-head
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CPU plugin runs (shared cores)

import torch  # noqa: E402
from cpu_qgemm_micro import best_time, loadavg, tree_and_others  # noqa: E402
from infer_cpu import kernels  # noqa: E402
from infer_cpu.quant.packing import quantize_q8_blocks  # noqa: E402

LAYERS, H, HKV, D, HIDDEN, VOCAB = 30, 9, 3, 64, 576, 49152
PROMPT = 128  # positions of each sequence in consecutive slots; the rest are interleaved


def block_tables(b: int, seq_len: int, page: int) -> tuple[torch.Tensor, int]:
    """[b, pages per sequence] int32 tables and the number of pages in the pool."""
    if page == 1:
        pos = torch.arange(seq_len)
        prompt = torch.arange(b)[:, None] * PROMPT + pos[None, :PROMPT]
        gen = b * PROMPT + (pos[None, PROMPT:] - PROMPT) * b + torch.arange(b)[:, None]
        slots = torch.cat([prompt, gen], 1)[:, :seq_len]
        return slots.to(torch.int32).contiguous(), int(slots.max()) + 1
    per = -(-seq_len // page)
    perm = torch.randperm(b * per, generator=torch.Generator().manual_seed(0))
    return perm.view(b, per).to(torch.int32).contiguous(), b * per


KV_DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def attention_fn(lib: ctypes.CDLL, b: int, seq_len: int, page: int, kv: str = "float32",
                 hot: bool = False):
    """One call per layer over 30 layers' caches (one decode step's attention); ``kv``: the
    cache dtype (bf16: ``--kv-cache-dtype bf16``, fp16: a GGUF file's default; libraries from
    before them take float32 caches only);
    ``hot``: every call reads the first layer's cache (what the arithmetic costs with the keys and
    values in the caches, no memory traffic)."""
    tables, pages = block_tables(b, seq_len, page)
    dt = KV_DTYPES[kv]
    code = kernels.KV_CODES[dt]  # the library's kv16 argument
    caches = [(torch.randn(pages, page, HKV, D).to(dt), torch.randn(pages, page, HKV, D).to(dt))
              for _ in range(1 if hot else LAYERS)] * (LAYERS if hot else 1)
    qkv = torch.randn(b, (H + 2 * HKV) * D)
    last = seq_len - 1
    slots = (tables[:, last // page].long() * page + last % page).contiguous()
    lens = torch.full((b,), seq_len, dtype=torch.int32)
    out = torch.empty(b, H, D)
    w = qkv.stride(0)
    q, k, v = qkv.data_ptr(), qkv[:, H * D:].data_ptr(), qkv[:, (H + HKV) * D:].data_ptr()

    def step():
        for kc, vc in caches:
            lib.infer_paged_decode(q, w, k, w, v, w, kc.data_ptr(), vc.data_ptr(),
                                   slots.data_ptr(), tables.data_ptr(), tables.stride(0),
                                   lens.data_ptr(), out.data_ptr(), b, H, HKV, D, page,
                                   D ** -0.5, code)
    return step, (caches, tables, qkv, slots, lens, out)


def lm_head_fn(lib: ctypes.CDLL, w, m: int):
    x = torch.randn(m, HIDDEN)
    y = torch.empty(m, VOCAB)

    p, i, n = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    if hasattr(lib, "infer_fgemm"):  # the batch-invariant GEMM (issue 13), kind 8 = Q8_0
        def call():
            lib.infer_fgemm(i(8), p(x.data_ptr()), n(x.stride(0)), i(m), i(HIDDEN),
                            p(w.blocks.data_ptr()), None, i(VOCAB), p(y.data_ptr()), n(VOCAB))
    else:  # older sources
        def call():
            lib.infer_q8f_gemm(p(x.data_ptr()), n(x.stride(0)), i(m), i(HIDDEN),
                               p(w.blocks.data_ptr()), i(VOCAB), p(y.data_ptr()), n(VOCAB))
    return call, (x, y)


def compare(label: str, fns: dict, rounds: int, budget: float) -> None:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_time(fn, budget))
    cells = [f"{name} {best[name] * 1e3:7.2f} ms" for name in fns]
    base = "tree" if "tree" in fns else next(iter(fns))  # "A 1.20x B": A is 1.2 times as fast
    ratios = [f"{base} {best[name] / best[base]:.2f}x {name}" for name in fns if name != base]
    print(f"{label} | " + " | ".join(cells) + (" | " + ", ".join(ratios) if ratios else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="append", default=[],
                    help="another infer_cpu_kernels.c: a file or a git revision (repeatable)")
    ap.add_argument("-b", "--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--seq-len", type=int, nargs="+", default=[192])
    ap.add_argument("--page", type=int, nargs="+", default=[1, 16])
    ap.add_argument("-m", "--rows", type=int, nargs="+", default=[1, 32],
                    help="LM-head activation rows")
    ap.add_argument("--kv", nargs="+", default=["float32"], choices=list(KV_DTYPES),
                    help="cache dtypes (bf16, fp16: the working tree's kernels only, unless "
                         "--compare-16-bit)")
    ap.add_argument("--compare-16-bit", action="store_true",
                    help="the --compare versions read bf16 and fp16 caches too (from 2026-11-28)")
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--hot", action="store_true",
                    help="attention: all 30 calls read one layer's cache (in the CPU caches)")
    ap.add_argument("--no-lm-head", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; best is kept")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per timing")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        libs, threads = tree_and_others(args.compare, Path(tmp))
        print(f"threads {threads}, load {loadavg()}; best of {args.rounds} rounds")
        if not args.no_attention:
            for b in args.batch:
                for s in args.seq_len:
                    for page in args.page:
                        fns, keep = {}, []
                        for kv in args.kv:
                            for name, lib in libs.items():
                                if kv != "float32" and name != "tree" and not args.compare_16_bit:
                                    continue  # an older library may read any 16-bit code as bf16
                                key = name if kv == "float32" else f"{name}-{kv}"
                                fns[key], k = attention_fn(lib, b, s, page, kv, args.hot)
                                keep.append(k)
                        compare(f"attention x{LAYERS} B={b:2d} L={s:4d} page={page:2d}", fns,
                                args.rounds, args.budget)
        if not args.no_lm_head:
            w = quantize_q8_blocks(torch.randn(VOCAB, HIDDEN) * 0.05)
            for m in args.rows:
                fns, keep = {}, []
                for name, lib in libs.items():
                    fns[name], k = lm_head_fn(lib, w, m)
                    keep.append(k)
                compare(f"lm head {VOCAB}x{HIDDEN} M={m:2d}", fns, args.rounds, args.budget)
        print(f"load {loadavg()}")


if __name__ == "__main__":
    main()
