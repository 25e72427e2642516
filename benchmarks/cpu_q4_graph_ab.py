"""The default model's native stack (``infer_decode_layers``: every decode, prefill and mixed step
of the GGUF model, the LM head aside) of this checkout's kernels against another version's, in
the real engine over an offline workload, each step run by both libraries back to back.

    python benchmarks/cpu_q4_graph_ab.py --compare HEAD [--max-running 8 32] [--prompts 32]

An ``EngineCore`` on the default model (int16 activations unless ``INFER_CPU_ACTIVATIONS`` says
otherwise) serves ``--prompts`` random-id requests (128 in / 128 out) at most ``--max-running`` at
a time. Its graph runner's native call is wrapped: each step's hidden rows are saved, both
libraries run the step in turn from the same rows (the order alternating step by step), and the
outputs must be the same bits (the KV rows each writes are the same too, so the second write is a
no-op). The other version runs on weight tiles it packed itself (its layout may differ). The two libraries then saw the same batches at the same moments, so the machine's load
moves both alike; the table gives each one's total time per kind of step (decode by batch size;
prefill and mixed steps together) and the ratio. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_qgemm_micro import build_other  # noqa: E402
from infer_cpu import kernels  # noqa: E402


class PairedCall:
    """Stands in for the graph's ``infer_decode_layers``: runs every library on the same rows."""

    def __init__(self, libs: dict[str, ctypes.CDLL], hidden: int) -> None:
        self.libs, self.hidden, self.n = libs, hidden, 0
        self._untiled: dict[int, ctypes.Array] = {}
        self._retiled: dict[tuple[str, int], tuple[ctypes.Array, list]] = {}
        self.decode = True  # whether the step being run is a decode batch (set per step)
        self.times: dict[tuple[str, str], list[float]] = defaultdict(list)

    def __call__(self, table, n_layers, h_ptr, rows, *rest):
        n = rows * self.hidden
        h = torch.frombuffer((ctypes.c_float * n).from_address(h_ptr), dtype=torch.float32)
        h0, outs = h.clone(), {}
        names = list(self.libs) if self.n % 2 == 0 else list(self.libs)[::-1]
        threads = kernels._threads[0]  # the count the runner just set (tree library)
        kind = f"decode {rows}" if self.decode else "prefill / mixed"
        for name in names:
            lib = self.libs[name]
            lib.infer_set_threads(threads)
            h.copy_(h0)
            arg = (self.retiled(name, table, n_layers, rest[:5]) if hasattr(lib, "infer_pack_tiles")
                   else ctypes.addressof(self.untiled(table, n_layers)))
            t = time.perf_counter()
            rc = lib.infer_decode_layers(arg, n_layers, h_ptr, rows, *rest)
            self.times[(kind, name)].append(time.perf_counter() - t)
            if rc:
                raise RuntimeError(f"{name}: infer_decode_layers returned {rc}")
            outs[name] = h.clone()
        first = next(iter(outs.values()))
        for name, out in outs.items():
            if not torch.equal(out, first):
                raise SystemExit(f"{name} computed other bits than {next(iter(outs))} (step {self.n})")
        self.n += 1
        return 0

    def retiled(self, name: str, table: ctypes.Array, n_layers: int, dims: tuple) -> ctypes.Array:
        """The layer table with the weights' tiles packed by library ``name`` itself (the other
        version may lay its tiles out differently; the tree's are the runner's own)."""
        if name == "tree":
            return table
        key = (name, ctypes.addressof(table))
        if key not in self._retiled:
            lib, (hidden, heads, kv_heads, head_dim, inter) = self.libs[name], dims
            shapes = {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
                      "o": (hidden, heads * head_dim), "gu": (2 * inter, hidden),
                      "down": (hidden, inter)}
            copy, keep = (type(table[0]) * n_layers)(*table), []
            for i in range(n_layers):
                for proj, (n, k) in shapes.items():
                    kind, w = getattr(copy[i], f"kind_{proj}"), getattr(copy[i], f"w{proj}")
                    size = lib.infer_tiles_bytes(kind, n, k) if getattr(copy[i], f"t{proj}") else 0
                    buf = torch.empty(size, dtype=torch.uint8) if size else None
                    if buf is not None:
                        lib.infer_pack_tiles(kind, w, n, k, buf.data_ptr())
                        keep.append(buf)
                    setattr(copy[i], f"t{proj}", buf.data_ptr() if buf is not None else None)
            self._retiled[key] = (copy, keep)
        return self._retiled[key][0]

    def untiled(self, table: ctypes.Array, n_layers: int) -> ctypes.Array:
        """The layer table as kernels older than the packed tiles read it: their ``infer_layer``
        ends at the caches, so an array of the new one would be read at the wrong stride."""
        key = ctypes.addressof(table)
        if key not in self._untiled:
            self._untiled[key] = (_UntiledLayer * n_layers)(*(
                _UntiledLayer(*(getattr(table[i], f) for f, _ in _UntiledLayer._fields_))
                for i in range(n_layers)))
        return self._untiled[key]


class _UntiledLayer(ctypes.Structure):
    _fields_ = [f for f in kernels.Layer._fields_ if f[0] not in ("tqkv", "to", "tgu", "tdown")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", required=True, help="a .c file or a git revision of the kernels")
    ap.add_argument("--max-running", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()

    from infer.cli.bench_engine import run_offline, warmup
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.loader.default_model import ensure_default_model

    tree = kernels.load()
    if tree is None:
        raise SystemExit(f"native kernels unavailable: {kernels.status().detail}")
    with tempfile.TemporaryDirectory() as tmp:
        other = build_other(args.compare, Path(tmp))
        other.infer_decode_layers.restype = ctypes.c_int
        if hasattr(other, "infer_tiles_bytes"):
            other.infer_tiles_bytes.restype = ctypes.c_size_t
        if not hasattr(other, "infer_pack_tiles"):  # takes the older table (PairedCall.untiled)
            other.infer_decode_layers.argtypes = [ctypes.c_void_p,
                                                  *other.infer_decode_layers.argtypes[1:]]
        libs = {"tree": tree, args.compare: other}
        path = str(ensure_default_model(quiet=True))
        print(f"threads {torch.get_num_threads()}, load {os.getloadavg()}, "
              f"activations {os.environ.get('INFER_CPU_ACTIVATIONS', 'int16 (default)')}")
        for mr in args.max_running:
            core = EngineCore(ServerArgs(model_path=path, max_running_requests=mr))
            runner = core.runner.graph_runner
            if runner is None or not runner.ok:
                raise SystemExit(f"no native graph: {getattr(runner, 'reason', None)}")
            paired = PairedCall(libs, runner.hidden)
            run = runner.run

            def tagged(batch, run=run, paired=paired):
                paired.decode = batch.attn.is_decode_only
                return run(batch)

            runner.run, runner._fn = tagged, paired
            warmup(core, random.Random(0))
            paired.times.clear()
            run_offline(core, args.prompts, args.input_len, args.output_len, 1.0,
                        random.Random(1), progress=False)
            print(f"\nmax running {mr}: {paired.n} steps, both libraries gave the same bits; "
                  f"load {os.getloadavg()[0]:.2f}")
            print(f"| step | steps | tree (s) | {args.compare} (s) | {args.compare} / tree |")
            print("| --- | --- | --- | --- | --- |")
            kinds = sorted({k for k, _ in paired.times},  # prefill first, then decode by rows
                           key=lambda k: (k[0] != "p", int(k.split()[-1]) if k[0] == "d" else 0))
            for kind in kinds:
                t = sum(paired.times[(kind, "tree")])
                o = sum(paired.times[(kind, args.compare)])
                print(f"| {kind} | {len(paired.times[(kind, 'tree')])} | {t:.3f} | {o:.3f} | "
                      f"{o / t:.2f} |" if t else f"| {kind} | 0 | | | |")
            del core


if __name__ == "__main__":
    main()
