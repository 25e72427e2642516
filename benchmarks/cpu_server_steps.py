"""Where the server's time goes against the engine alone, step by step: the same requests through
``infer serve`` (SGLang-style streaming client, ``infer bench serving``) and through ``infer bench
offline``, with every engine step of both traced (a ``sitecustomize`` hook on the benchmark's
``PYTHONPATH`` only, nothing in the server changes).

    python benchmarks/cpu_server_steps.py --model-path /tmp/smollm2-bf16 --dtype bfloat16
    python benchmarks/cpu_server_steps.py --model-path smollm2 --clients 32 --num-prompts 64

Per step the hook logs its wall time, its decode rows and prefill tokens, and the native call's
own time and end (``ThreadChoice.record``: the bf16 stack's and the GGUF decode graph's), so a
full-batch decode step splits into *before* the native call (scheduling, inputs), the native
call, *after* it (the GGUF LM head, sampling, outputs) and the *gap* to the next step (the
server's loop: outputs sent over ZMQ, new requests drained). The server's engine also logs when
each request reaches it, so the table shows how long the first ``--clients`` requests took to
arrive (the HTTP process parses and tokenizes them while the engine already runs the first).
Prints one table (medians, means in brackets) and the throughputs; no file is written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

HOOK = textwrap.dedent('''
    import os, time
    _out = os.environ.get("INFER_STEP_TRACE")
    if _out:
        from cpu_engine_steps import batch_shape
        from infer.core.engine import engine_core as _ec
        from infer_cpu.kernels import bf16 as _kb
        _native = [0.0, 0.0]  # seconds so far, end of the last call
        _rec = _kb.ThreadChoice.record
        def _record(self, batch, threads, seconds):
            _native[0] += seconds
            _native[1] = time.perf_counter()
            _rec(self, batch, threads, seconds)
        _kb.ThreadChoice.record = _record
        _log = open(f"{_out}.steps.{os.getpid()}", "w", buffering=1)
        _shape = [(0, 0)]  # the step's batch: decode rows, prefill tokens
        _step = _ec.EngineCore.step
        def step(self):
            ex = self.executor
            if not getattr(ex, "_traced", False):  # its launch notes each batch's shape
                launch = ex.launch
                def seen(batch, defer):
                    _shape[0] = batch_shape(batch)
                    return launch(batch, defer)
                ex.launch, ex._traced = seen, True
            _shape[0] = (0, 0)
            n0, t0 = _native[0], time.perf_counter()
            outs = _step(self)
            dec, pre = _shape[0]
            _log.write(f"{t0:.6f} {time.perf_counter():.6f} {dec} {pre} "
                       f"{_native[0] - n0:.6f} {_native[1]:.6f}\\n")
            return outs
        _ec.EngineCore.step = step
        try:
            from infer.server import engine_proc as _ep
        except ImportError:
            _ep = None
        if _ep is not None:
            _adds = open(f"{_out}.adds.{os.getpid()}", "w", buffering=1)
            _add = _ep._EngineLoop._add
            def add(self, msg):
                _adds.write(f"{time.perf_counter():.6f}\\n")
                return _add(self, msg)
            _ep._EngineLoop._add = add
''')


def _load(prefix: str, kind: str) -> list[list[float]]:
    """The longest trace file of this kind (the engine process's; others are empty)."""
    files = sorted(Path(prefix).parent.glob(f"{Path(prefix).name}.{kind}.*"),
                   key=lambda p: p.stat().st_size)
    if not files:
        return []
    return [[float(x) for x in line.split()] for line in files[-1].read_text().splitlines()]


def _bench(cmd: list[str], env: dict, result: Path) -> dict:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed:\n{proc.stderr[-2000:]}")
    data = json.loads(result.read_text())
    return data["results"][0] if "results" in data else data


def _summary(steps: list[list[float]], since: float, full: int) -> dict:
    steps = [s for s in steps if s[0] >= since]
    rows, other = [], []  # full-batch decode steps: (step, native, before, after, gap before)
    for i, (t0, t1, dec, pre, nat, nat_end) in enumerate(steps):
        if dec == full and pre == 0 and i > 0 and nat > 0:
            rows.append((t1 - t0, nat, nat_end - nat - t0, t1 - nat_end, t0 - steps[i - 1][1]))
        else:
            other.append(t1 - t0)
    gaps = [b[0] - a[1] for a, b in zip(steps, steps[1:], strict=False)]
    cols = list(zip(*rows, strict=True)) if rows else [[0.0]] * 5
    return {"span": steps[-1][1] - steps[0][0] if steps else 0.0, "steps": len(steps),
            "full": len(rows), "cols": cols, "other_n": len(other), "other_s": sum(other),
            "gaps_s": sum(gaps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="smollm2")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--port", type=int, default=30190)
    args = ap.parse_args()
    extra = ["--dtype", args.dtype] if args.dtype else []
    lens = ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(HOOK)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the hook, and batch_shape's module
            [tmp, str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
        url = f"http://127.0.0.1:{args.port}"
        srv_env = dict(env, INFER_STEP_TRACE=f"{tmp}/srv")
        server = subprocess.Popen(["infer", "serve", "--model-path", args.model_path, *extra,
                                   "--port", str(args.port)], env=srv_env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(url + "/v1/models", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit("the server exited during start-up") from None
                    time.sleep(0.5)
            serving = ["infer", "bench", "serving", "--base-url", url, "--disable-tqdm", *lens]
            subprocess.run([*serving, "--num-prompts", "4", "--max-concurrency", "4"], env=env,
                           check=True, capture_output=True)
            since = time.perf_counter()  # CLOCK_MONOTONIC: the engine process's clock too
            srv = _bench([*serving, "--num-prompts", str(args.num_prompts), "--max-concurrency",
                          str(args.clients), "--result-file", f"{tmp}/srv.json"], env,
                         Path(tmp, "srv.json"))
        finally:
            server.terminate()
            server.wait(timeout=60)
        off_env = dict(env, INFER_STEP_TRACE=f"{tmp}/off")
        off = _bench(["infer", "bench", "offline", "--model-path", args.model_path, *extra,
                      "--num-prompts", str(args.num_prompts), *lens, "--max-running-requests",
                      str(args.clients), "--result-file", f"{tmp}/off.json"], off_env,
                     Path(tmp, "off.json"))
        s_steps, o_steps = _load(f"{tmp}/srv", "steps"), _load(f"{tmp}/off", "steps")
        adds = [a[0] for a in _load(f"{tmp}/srv", "adds") if a[0] >= since]
        # the offline run's steps: those after its warm-up (the last gap of a second or more)
        o_since = max([b[0] for a, b in zip(o_steps, o_steps[1:], strict=False) if b[0] - a[1] > 1.0],
                      default=o_steps[0][0] if o_steps else 0.0)
    s, o = _summary(s_steps, since, args.clients), _summary(o_steps, o_since, args.clients)

    def ms(col: list[float]) -> str:
        return f"{statistics.median(col) * 1e3:.2f} ({statistics.mean(col) * 1e3:.2f})"

    print(f"{args.model_path} {' '.join(extra)}: {args.num_prompts} requests, {args.input_len} in "
          f"/ {args.output_len} out, {args.clients} running; medians (means) in ms")
    print("| | server | offline |")
    print("| --- | --- | --- |")
    print(f"| output tok/s | {srv['output_throughput']:.1f} | {off['output_throughput']:.1f} "
          f"(server / offline {srv['output_throughput'] / off['output_throughput']:.3f}) |")
    print(f"| engine steps, span (s) | {s['steps']}, {s['span']:.3f} | {o['steps']}, "
          f"{o['span']:.3f} |")
    print(f"| {args.clients}-row decode steps | {s['full']} | {o['full']} |")
    for i, name in enumerate(("their wall time", "the native call", "before it", "after it",
                              "gap before the step")):
        print(f"| {name} | {ms(s['cols'][i])} | {ms(o['cols'][i])} |")
    print(f"| other steps (prefill, mixed, smaller), s | {s['other_n']}, {s['other_s']:.3f} | "
          f"{o['other_n']}, {o['other_s']:.3f} |")
    print(f"| gaps between steps, s | {s['gaps_s']:.3f} | {o['gaps_s']:.3f} |")
    if len(adds) >= args.clients:
        print(f"| the first {args.clients} requests reached the engine within | "
              f"{(adds[args.clients - 1] - adds[0]) * 1e3:.1f} ms | (all at once) |")


if __name__ == "__main__":
    main()
