"""The bf16 decode stack alone (``infer_bf16_decode_layers``: every layer, final norm and LM head
in one native call), this checkout's library against the one built from a git revision,
alternating, in one run.

    python benchmarks/cpu_bf16_decode_micro.py --rev 95f99ae [--batch 1 32] [--context 160]
                                               [--threads 1 2] [--rounds 2] [--mixed N]
                                               [--prefill L] [--check-bits]
                                               [--page 1 --interleave 128] [--greedy]

SmolLM2-135M's shapes (30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary
49,152) with random bf16 weights and a random bf16 KV cache of ``--context`` tokens per sequence
(+-8), pages of 16. Each (library, batch, threads) point is the best of 12 steps; rounds
alternate the libraries. Prints step time and rows per second, and the load average. No model
files and no engine: what changes between the libraries is the C code only. ``--check-bits``: per
batch, one step of each library from the same weights, caches and rows, and whether their logits
are the same bits (for a change meant to keep every value).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB, PAGE = 576, 9, 3, 64, 1536, 30, 49152, 16
INTERLEAVE = 0  # --interleave
GREEDY = False  # --greedy


def build_rev(rev: str, out_dir: Path) -> Path:
    """The bf16 library of revision ``rev`` (its .c and headers), compiled as the plugin does."""
    from cpu_qgemm_micro import revision_kernels

    src = revision_kernels(rev, out_dir)
    lib = src / "libbf16.so"
    subprocess.run(["cc", "-O3", "-march=native", "-shared", "-fPIC", "-o", str(lib),
                    str(src / "infer_cpu_bf16.c"), "-lm", "-lpthread"], check=True)
    return lib


class Stack:
    """Random SmolLM2-shaped weights and caches, and the step's metadata, for ``batch`` rows."""

    def __init__(self, batch: int, context: int, seed: int = 0) -> None:
        import torch
        from infer.core.model.layers.rotary import rope_table
        from infer_cpu.kernels import bf16 as kb

        g = torch.Generator().manual_seed(seed)

        def packed(n: int, k: int):
            return kb.pack((torch.randn(n, k, generator=g) * k ** -0.5).bfloat16())

        per = (context + 8 + PAGE - 1) // PAGE
        shape = (batch * per + 1 + batch + 2048 // PAGE, PAGE, KV_HEADS, HEAD_DIM)  # + a 2048-token prompt
        self.keep: list = []
        self.table = (kb.Layer * LAYERS)()
        for i in range(LAYERS):
            norms = torch.ones(HIDDEN), torch.ones(HIDDEN)
            ws = [packed((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), packed(HIDDEN, HEADS * HEAD_DIM),
                  packed(2 * INTER, HIDDEN), packed(HIDDEN, INTER)]
            kc = torch.randn(shape, generator=g).bfloat16()
            vc = torch.randn(shape, generator=g).bfloat16()
            self.table[i] = kb.Layer(norms[0].data_ptr(), norms[1].data_ptr(),
                                     *(w.data.data_ptr() for w in ws), None, kc.data_ptr(),
                                     vc.data_ptr())
            self.keep += [norms, ws, kc, vc]
        rng = random.Random(seed)
        self.bt = torch.arange(1, 1 + batch * per, dtype=torch.int32).view(batch, per)
        if PAGE == 1 and INTERLEAVE:  # the engine's order: prompts in runs, then decode steps
            n = min(INTERLEAVE, per)  # writing one slot per sequence in turn
            i = torch.arange(per)
            b = torch.arange(batch)[:, None]
            self.bt = torch.where(i < n, 1 + b * n + i, 1 + batch * n + (i - n) * batch + b
                                  ).to(torch.int32)
        self.lens = torch.tensor([context + rng.randrange(-8, 8) for _ in range(batch)],
                                 dtype=torch.int32)
        self.pos = (self.lens - 1).long()
        self.slots = torch.tensor([int(self.bt[b, (n - 1) // PAGE]) * PAGE + (n - 1) % PAGE
                                   for b, n in enumerate(self.lens.tolist())], dtype=torch.int64)
        self.cos_sin = rope_table(HEAD_DIM, 4096, {"rope_theta": 10000.0})
        w = (torch.randn(VOCAB, HIDDEN, generator=g) * HIDDEN ** -0.5).bfloat16()
        self.lm = kb.pack(w)
        self.screen = kb.ScreenData(w) if GREEDY else None  # --greedy: the int8 screen's ids
        self.ids = torch.empty(batch, dtype=torch.int64)
        self.final_norm = torch.ones(HIDDEN)
        self.logits = torch.empty(batch, VOCAB)
        self.h0 = torch.randn(batch, HIDDEN, generator=g)
        self.batch = batch

    def mixed_step(self, fn, threads: int, prefill: int) -> float:
        """The batch's rows as decode rows plus one new sequence of ``prefill`` tokens, through
        ``infer_bf16_forward_layers`` (the chunked-prefill step a busy server runs)."""
        import torch

        b, per = self.batch, self.bt.shape[1]
        first = int(self.bt.max()) + 1
        pages = (prefill + PAGE - 1) // PAGE
        extra = torch.arange(first, first + pages, dtype=torch.int32)
        width = max(per, pages)
        bt = torch.zeros(b + 1, width, dtype=torch.int32)
        bt[:b, :per] = self.bt
        bt[b, :pages] = extra
        lens = torch.cat([self.lens, torch.tensor([prefill], dtype=torch.int32)])
        ext = torch.tensor([1] * b + [prefill], dtype=torch.int32)
        pos = torch.cat([self.pos, torch.arange(prefill)])
        slots = torch.cat([self.slots, torch.tensor([int(extra[i // PAGE]) * PAGE + i % PAGE
                                                     for i in range(prefill)], dtype=torch.int64)])
        rows = torch.cat([torch.arange(b), torch.tensor([b + prefill - 1])]).long()
        h = torch.cat([self.h0, torch.randn(prefill, HIDDEN)])
        return self.forward(fn, threads, h, pos, slots, bt, lens, ext, rows)

    def forward(self, fn, threads: int, h, pos, slots, bt, lens, ext, rows) -> float:
        """One timed ``infer_bf16_forward_layers`` call: rows h [T, hidden] at positions pos,
        their keys written at slots; per sequence its block table row, length and extend length;
        logits of the rows ``rows``."""
        import torch

        logits = self.logits_out = torch.empty(rows.shape[0], VOCAB)
        t = time.perf_counter()
        fn(self.table, LAYERS, h.data_ptr(), h.shape[0], HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER,
           1e-5, pos.data_ptr(), self.cos_sin.data_ptr(), HEAD_DIM, slots.data_ptr(),
           bt.data_ptr(), bt.stride(0), lens.data_ptr(), ext.data_ptr(), lens.shape[0], PAGE,
           HEAD_DIM ** -0.5, threads, self.final_norm.data_ptr(), 1e-5, self.lm.data.data_ptr(),
           VOCAB, rows.data_ptr(), rows.shape[0], logits.data_ptr(), None, None)
        return time.perf_counter() - t

    def prefill_step(self, fn, threads: int, length: int) -> float:
        """A prefill batch: each of the batch's sequences a new ``length``-token prompt in its own
        pages, through ``infer_bf16_forward_layers`` (the step that starts a wave of requests)."""
        import torch

        b, per = self.batch, self.bt.shape[1]
        if per * PAGE < length:
            raise SystemExit(f"--prefill {length} needs --context {length} or more")
        lens = torch.full((b,), length, dtype=torch.int32)
        pos = torch.arange(length).repeat(b)
        slots = torch.tensor([int(self.bt[s, i // PAGE]) * PAGE + i % PAGE
                              for s in range(b) for i in range(length)], dtype=torch.int64)
        rows = (torch.arange(b) * length + length - 1).long()
        h = torch.randn(b * length, HIDDEN)
        return self.forward(fn, threads, h, pos, slots, self.bt, lens, lens, rows)

    def step(self, fn, threads: int) -> float:
        h = self.h0.clone()
        t = time.perf_counter()
        fn(self.table, LAYERS, h.data_ptr(), self.batch, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER,
           1e-5, self.pos.data_ptr(), self.cos_sin.data_ptr(), HEAD_DIM, self.slots.data_ptr(),
           self.bt.data_ptr(), self.bt.stride(0), self.lens.data_ptr(), PAGE, HEAD_DIM ** -0.5,
           threads, self.final_norm.data_ptr(), 1e-5, self.lm.data.data_ptr(), VOCAB,
           *((None, ctypes.byref(self.screen.struct), self.ids.data_ptr()) if self.screen
             else (self.logits.data_ptr(), None, None)))  # (an older revision ignores the two)
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="git revision of the baseline library")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--page", type=int, default=16,
                    help="tokens per KV page (the engine's default is 1)")
    ap.add_argument("--interleave", type=int, default=0, metavar="N",
                    help="with --page 1: each sequence's first N positions in one run of slots, "
                         "the later ones interleaved across the batch (as the engine's decode "
                         "steps write them)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--mixed", type=int, default=0, metavar="N",
                    help="time mixed steps instead: the batch's decode rows plus an N-token prompt "
                         "(infer_bf16_forward_layers; the baseline revision needs it)")
    ap.add_argument("--prefill", type=int, default=0, metavar="L",
                    help="time prefill steps instead: every one of the batch's sequences an "
                         "L-token prompt (infer_bf16_forward_layers; tok/s counts prompt tokens)")
    ap.add_argument("--check-bits", action="store_true",
                    help="also compare one step's logits of the two libraries, bit for bit")
    ap.add_argument("--greedy", action="store_true",
                    help="decode steps that return greedy ids through the LM head's int8 screen "
                         "(the engine's greedy steps) instead of logits; --check-bits compares ids")
    args = ap.parse_args()
    global PAGE, INTERLEAVE, GREEDY
    PAGE, INTERLEAVE, GREEDY = args.page, args.interleave, args.greedy
    if args.greedy and (args.mixed or args.prefill):
        raise SystemExit("--greedy times decode steps: leave out --mixed and --prefill")
    if args.mixed and args.prefill:
        raise SystemExit("--mixed and --prefill are two different steps: give one")

    from infer_cpu.kernels import bf16 as kb

    with tempfile.TemporaryDirectory() as tmp:
        base = ctypes.CDLL(str(build_rev(args.rev, Path(tmp))))
        name = ("infer_bf16_forward_layers" if args.mixed or args.prefill
                else "infer_bf16_decode_layers")
        libs = {args.rev: getattr(base, name), "this tree": getattr(kb.load(), name)}
        for fn in libs.values():
            fn.argtypes = kb.SIGNATURES[name]
            fn.restype = None
        if args.check_bits:
            import torch

            for batch in args.batch:
                outs = []
                for fn in libs.values():
                    stack = Stack(batch, args.context)
                    torch.manual_seed(0)  # the mixed step's new rows
                    if args.mixed:
                        stack.mixed_step(fn, 2, args.mixed)
                    elif args.prefill:
                        stack.prefill_step(fn, 2, args.prefill)
                    else:
                        stack.step(fn, 2)
                    outs.append(stack.ids.clone() if args.greedy
                                else stack.logits if not (args.mixed or args.prefill)
                                else stack.logits_out)
                if args.greedy:
                    print(f"batch {batch}: greedy ids "
                          f"{'the same' if torch.equal(outs[0], outs[1]) else 'DIFFER'}")
                    continue
                same = torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))
                print(f"batch {batch}: logits {'the same bits' if same else 'DIFFER'} "
                      f"(largest difference {(outs[0] - outs[1]).abs().max().item():.3g})")
        best: dict[tuple, float] = {}
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        for batch in args.batch:
            stack = Stack(batch, args.context)
            for _ in range(args.rounds):
                for name, fn in libs.items():
                    for threads in args.threads:
                        t = min((stack.mixed_step(fn, threads, args.mixed) if args.mixed
                                 else stack.prefill_step(fn, threads, args.prefill) if args.prefill
                                 else stack.step(fn, threads)) for _ in range(args.steps))
                        key = (batch, threads, name)
                        best[key] = min(best.get(key, t), t)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        what = (f"decode rows + a {args.mixed}-token prompt" if args.mixed
                else f"{args.prefill}-token prompts, one a row of the batch" if args.prefill
                else "decode rows")
        counted = "prompt" if args.prefill else "decode rows'"
        print(f"steps of {what}; tok/s counts the {counted} tokens")
        print("| batch | threads | " + " | ".join(f"{n} (ms / tok/s)" for n in libs) + " | ratio |")
        print("| --- | --- | " + " | ".join("---" for _ in libs) + " | --- |")
        for batch in args.batch:
            for threads in args.threads:
                ts = [best[(batch, threads, n)] for n in libs]
                toks = batch * (args.prefill or 1)
                cells = " | ".join(f"{t * 1e3:.1f} / {toks / t:.0f}" for t in ts)
                print(f"| {batch} | {threads} | {cells} | {ts[0] / ts[1]:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
