"""The CPU peer comparison in one run: infer vs transformers (and llama.cpp where it imports),
alternating round by round, then serving (infer serve vs a one-request-at-a-time transformers
server) with the same client. Writes JSON under benchmarks/out/, the table into
benchmarks/RESULTS.md (between the cpu-results markers, other sections kept) and a PNG plot.

    python benchmarks/run_cpu.py --rounds 2
    python benchmarks/run_cpu.py --vllm-peer --rounds 2   # vLLM's CPU build: see vllm_peer.py
    python benchmarks/run_cpu.py --kernels-ab HEAD~1 --rounds 2 --batch-size 1 8 32
        # the engine with the tree's kernels (float32 and int8 activations) against another
        # revision's infer_cpu_kernels.c, alternating: see kernels_ab
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- cpu-results:begin -->", "<!-- cpu-results:end -->"


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_json(cmd: list[str], log: list, timeout: int) -> list[dict]:
    t = time.time()
    before = load_avg()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    log.append({"cmd": " ".join(cmd), "rc": proc.returncode, "load_before": before,
                "load_after": load_avg(), "wall_s": round(time.time() - t, 1)})
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    print(f"[{load_avg()}] {' '.join(cmd[:4])}...: {len(rows)} rows, rc {proc.returncode}", flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(cmd: list[str], port: int, timeout: int = 900):
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            time.sleep(2)
        else:
            raise RuntimeError("server did not come up")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def best(rows: list[dict], bs: int) -> dict | None:
    rs = [r for r in rows if r["batch_size"] == bs]
    if not rs:
        return None
    out = dict(max(rs, key=lambda r: r["decode_throughput"]))
    out["prefill_latency_s"] = min(r["prefill_latency_s"] for r in rs)
    return out


def main() -> None:
    import vllm_peer  # beside this file, as plot_cpu

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve-prompts", type=int, default=32)
    ap.add_argument("--hf-serve-prompts", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE"])
    ap.add_argument("--skip-serving", action="store_true")
    ap.add_argument("--quality-windows", type=int, default=8)
    ap.add_argument("--quality-window-len", type=int, default=256)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--quality-only", action="store_true", help="Only the quality rows (with --merge: "
                    "into the summary.json already in --out).")
    ap.add_argument("--merge", action="store_true", help="Add to the summary.json already in --out.")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--report-only", type=Path, help="Rewrite RESULTS.md from a summary.json.")
    ap.add_argument("--kernels-ab", metavar="REV",
                    help="Only engine rows: the tree's native kernels (INFER_CPU_ACTIVATIONS=float32, "
                         "int16, int8) against REV's infer_cpu_kernels.c (float32), alternating.")
    ap.add_argument("--vllm-peer", action="store_true",
                    help="Serving rows against vLLM's CPU build instead (benchmarks/vllm_peer.py).")
    vllm_peer.add_arguments(ap)
    args = ap.parse_args()
    if args.vllm_peer:
        vllm_peer.write_results(vllm_peer.run(args))
        return
    if args.kernels_ab:
        kernels_ab(args)
        return
    if args.report_only:
        summary = json.loads(args.report_only.read_text())
        for k in ("batch_size", "input_len", "output_len", "threads", "concurrency", "omp_wait_policy"):
            setattr(args, k, summary["args"][k])
        write_results(summary, args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    # the same OpenMP settings for every engine (infer's CPU plugin defaults to passive waits)
    env_threads = {"OMP_NUM_THREADS": str(args.threads), "OMP_WAIT_POLICY": args.omp_wait_policy}
    os.environ.update(env_threads)
    lens = ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    bs_args = [a for b in args.batch_size for a in ("--batch-size", str(b))]
    try:
        import llama_cpp  # noqa: F401

        have_llama = True
    except ImportError:
        have_llama = False
    log: list = []
    rows: dict[str, list[dict]] = {"infer": [], "transformers-bf16": [], "llama.cpp": []}
    serving: dict[str, dict] = {}
    quality: dict[str, list[dict]] = {}
    kept_machine = None
    prev = args.out / "summary.json"
    if args.merge and prev.exists():  # add rounds to an earlier run of the same settings
        old = json.loads(prev.read_text())
        rows, serving, log = old["rows"], old["serving"], old["log"]
        quality = old.get("quality", {})
        kept_machine = old.get("machine")  # the machine line describes the speed rows' run
    if not args.skip_quality:
        quality = run_quality(args, have_llama, log)
    if args.quality_only:
        args.rounds, args.skip_serving = 0, True
    for i in range(args.rounds):
        res = args.out / f"infer_one_batch_r{i}.json"
        run_json(["infer", "bench", "one-batch", "--model-path", "smollm2", *bs_args, *lens,
                  "--result-file", str(res)], log, 3600)
        if res.exists():
            rows["infer"] += json.loads(res.read_text())["results"]
        rows["transformers-bf16"] += run_json(
            [sys.executable, str(HERE / "peer_transformers.py"), "--dtype", "bfloat16",
             "--threads", str(args.threads), "--batch-size", *map(str, args.batch_size), *lens], log, 3600)
        if have_llama:
            rows["llama.cpp"] += run_json([sys.executable, str(HERE / "peer_llamacpp.py"),
                                           "--threads", str(args.threads), *lens], log, 1800)
    if not args.skip_serving:
        port = free_port()
        with server(["infer", "serve", "--model-path", "smollm2", "--port", str(port)], port) as url:
            r = run_json(["infer", "bench", "serving", "--base-url", url, "--num-prompts",
                          str(args.serve_prompts), "--max-concurrency", str(args.concurrency), *lens,
                          "--disable-tqdm", "--result-file", str(args.out / "serving_infer.json")], log, 3600)
            serving["infer"] = r[0] if r else {}
        port = free_port()
        with server([sys.executable, str(HERE / "hf_server.py"), "--port", str(port),
                     "--threads", str(args.threads)], port) as url:
            r = run_json(["infer", "bench", "serving", "--base-url", url, "--num-prompts",
                          str(args.hf_serve_prompts), "--max-concurrency", str(args.concurrency),
                          *lens, "--disable-tqdm", "--result-file",
                          str(args.out / "serving_transformers.json")], log, 3600)
            serving["transformers-bf16 (one at a time)"] = r[0] if r else {}
    summary = {"rows": rows, "serving": serving, "quality": quality, "log": log,
               "machine": kept_machine or machine(), "args": vars(args)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    write_results(summary, args)


def kernels_ab(args) -> None:
    """Engine rows (``infer bench one-batch``: prefill of batch x input-len tokens, then decode) for
    the tree's kernels with INFER_CPU_ACTIVATIONS=float32, int16 (the default) and int8, and REV's
    ``infer_cpu_kernels.c`` (float32), in alternating rounds
    with the load average before and after each; prints a table of the best per variant and
    writes every row to --out/kernels_ab.json. REV's library is compiled into a cache directory of
    its own under the key the tree's source has (``native_build._target``), which is where the
    engine looks: the rest of the engine is the tree's, so only the kernels differ."""
    import tempfile

    sys.path.insert(0, str(HERE.parent / "plugins" / "cpu"))
    from infer_cpu import native_build

    env = {"OMP_NUM_THREADS": str(args.threads), "OMP_WAIT_POLICY": args.omp_wait_policy}
    lens = ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    bs_args = [a for b in args.batch_size for a in ("--batch-size", str(b))]
    args.out.mkdir(parents=True, exist_ok=True)
    cc = native_build.compiler()
    if cc is None:
        raise SystemExit("no C compiler")
    rel = native_build.SOURCE.resolve().relative_to(HERE.parent)
    old_src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{args.kernels_ab}:{rel}"],
                             check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["INFER_CACHE_DIR"] = tmp  # for _target: the tree's key, REV's library
        lib = native_build._target(cc, native_build.FLAG_SETS[0])
        lib.parent.mkdir(parents=True)
        (Path(tmp) / "rev.c").write_text(old_src)
        subprocess.run([cc, *native_build.FLAG_SETS[0], "-shared", "-fPIC", "-o", str(lib),
                        str(Path(tmp) / "rev.c"), "-lm"], check=True)
        del os.environ["INFER_CACHE_DIR"]
        f32 = {"INFER_CPU_ACTIVATIONS": "float32"}  # explicit: the default is int16 activations
        variants = {f"{args.kernels_ab} (float32)": {"INFER_CACHE_DIR": tmp} | f32,
                    "tree (float32)": f32,
                    "tree (int16 activations)": {"INFER_CPU_ACTIVATIONS": "int16"},
                    "tree (int8 activations)": {"INFER_CPU_ACTIVATIONS": "int8"}}
        rows: dict[str, list[dict]] = {v: [] for v in variants}
        log: list = []
        for i in range(args.rounds):
            for name, extra in variants.items():
                res = args.out / f"kernels_ab_{len(log)}.json"
                os.environ.update(env | extra)
                try:
                    run_json(["infer", "bench", "one-batch", "--model-path", "smollm2", *bs_args, *lens,
                              "--result-file", str(res)], log, 3600)
                finally:
                    for k in extra:
                        os.environ.pop(k, None)
                log[-1]["variant"], log[-1]["round"] = name, i
                if res.exists():
                    rows[name] += json.loads(res.read_text())["results"]
    (args.out / "kernels_ab.json").write_text(json.dumps({"rows": rows, "log": log,
                                                          "machine": machine()}, indent=2))
    print(f"\n{args.rounds} alternating rounds, best per variant; decode tok/s at each batch size, "
          f"prefill = batch x {args.input_len} tokens; load (1 min) {', '.join(e['load_before'].split()[0] + '-' + e['load_after'].split()[0] for e in log)}")
    head = " | ".join(f"decode b={b}" for b in args.batch_size)
    print(f"| kernels | {head} | prefill b={max(args.batch_size)} |")
    print("| --- |" + " --- |" * (len(args.batch_size) + 1))
    for name, rs in rows.items():
        cells = [best(rs, b) for b in args.batch_size]
        dec = " | ".join(f"{c['decode_throughput']:.1f}" if c else "-" for c in cells)
        pre = f"{cells[-1]['prefill_latency_s']:.2f} s" if cells[-1] else "-"
        print(f"| {name} | {dec} | {pre} |")


def run_quality(args, have_llama: bool, log: list) -> dict[str, list[dict]]:
    """infer's rows (the float32 reference, then the default path in each serving mode) and
    llama.cpp's on the same windows."""
    win = ["--windows", str(args.quality_windows), "--window-len", str(args.quality_window_len)]
    res = args.out / "quality_infer.json"
    run_json(["infer", "bench", "quality", "--model-path", "smollm2", *win, "--result-file",
              str(res)], log, 7200)
    quality = {"infer": json.loads(res.read_text())["results"] if res.exists() else []}
    if have_llama:
        quality["llama.cpp"] = run_json([sys.executable, str(HERE / "quality_llamacpp.py"),
                                         "--threads", str(args.threads), *win], log, 3600)
    return quality


def quality_verdict(quality: dict[str, list[dict]]) -> tuple[bool | None, str]:
    """Whether infer's default path meets the bar in every mode (None: not measured), and why."""
    rows = quality.get("infer") or []
    ref = next((r for r in rows if r["path"] == "float32 reference"), None)
    served = [r for r in rows if r["path"] == "infer"]
    if ref is None or not served:
        return None, "quality not measured in this run"
    peer = next(iter(quality.get("llama.cpp") or []), None)
    worst = max(r["perplexity"] for r in served)
    ok = worst <= ref["perplexity"] * 1.01 and (peer is None or worst <= peer["perplexity"])
    vs_peer = f", llama.cpp {peer['perplexity']:.4f}" if peer else ", llama.cpp not measured"
    return ok, (f"highest perplexity over the modes {worst:.4f} vs float32 reference "
                f"{ref['perplexity']:.4f} (bar: +1 %){vs_peer}")


def quality_lines(quality: dict[str, list[dict]]) -> list[str]:
    rows = quality.get("infer") or []
    if not rows:
        return []
    ref = next((r for r in rows if r["path"] == "float32 reference"), None)
    r0 = rows[0]
    lines = ["", f"Quality ({r0['windows']} windows of {r0['window_len']} tokens of Python's "
             "pydoc_data topics, {n} scored tokens; KL(reference || path) per token in nats; "
             "extend = {e}-token chunks after prefix-cache hits, decode = one-token steps after "
             "cache hits, batched over the windows):".format(n=r0["tokens"], e=next(
                 (r["extend_len"] for r in rows if r["mode"] == "extend"), "-")), "",
             "| path | mode | perplexity | vs float32 reference | mean KL | p99 KL | top-1 agreement |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows + list(quality.get("llama.cpp") or []):
        rel = f"{r['perplexity'] / ref['perplexity'] - 1:+.4%}" if ref else "n/a"
        kl = (f"{r['kl_mean']:.2e} | {r['kl_p99']:.2e} | {r['top1_agree']:.4f}" if "kl_mean" in r
              else "0 | 0 | 1")
        lines.append(f"| {r['path']} | {r['mode']} | {r['perplexity']:.4f} | {rel} | {kl} |")
    ok, why = quality_verdict(quality)
    lines += ["", f"Quality bar {'met' if ok else 'NOT met'}: {why}."]
    return lines


def machine() -> dict:
    import torch
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}
    with contextlib.suppress(ImportError):
        import llama_cpp

        info["llama_cpp_python"] = llama_cpp.__version__
    return info


def write_results(summary: dict, args) -> None:
    from plot_cpu import plot

    rows, serving, m = summary["rows"], summary["serving"], summary["machine"]
    args.rounds = sum(" one-batch " in e["cmd"] for e in summary["log"])  # merged runs add rounds
    lines = [BEGIN, f"## CPU: SmolLM2-135M-Instruct (Q4_1 GGUF), {args.threads} threads, "
             f"OMP_WAIT_POLICY={args.omp_wait_policy} for every engine", "",
             f"Machine: {m['cpu']}, {m['cores']} cores shared with other users; Python {m['python']}, "
             f"torch {m['torch']}, transformers {m['transformers']}"
             + (f", llama-cpp-python {m['llama_cpp_python']}" if "llama_cpp_python" in m else
                ", llama.cpp: llama-cpp-python not available (see below)") + ".",
             f"Lengths {args.input_len} in / {args.output_len} out, greedy, {args.rounds} alternating "
             "rounds, best round per engine. Load average (1/5/15 min) before and after every "
             "command is listed below: the machine was shared, so absolute numbers are noisy; "
             "ratios come from the same run.", "",
             "| engine | batch | decode tok/s | TTFT / prefill (ms) | decode vs transformers bf16 |",
             "| --- | --- | --- | --- | --- |"]
    quality = summary.get("quality") or {}
    ok, why = quality_verdict(quality)
    hidden = {"infer"} if ok is False else set()  # speed only for a path that meets the bar
    for bs in args.batch_size:
        ref = best(rows["transformers-bf16"], bs)
        for eng in ("infer", "transformers-bf16", "llama.cpp"):
            b = None if eng in hidden else best(rows[eng], bs)
            if b is None:
                continue
            ratio = f"{b['decode_throughput'] / ref['decode_throughput']:.2f}x" if ref else "n/a"
            lines.append(f"| {eng} | {bs} | {b['decode_throughput']:.1f} | "
                         f"{b['prefill_latency_s'] * 1000:.0f} | {ratio} |")
    if hidden:
        lines += ["", f"infer's speed rows are left out: its default path does not meet the quality "
                  f"bar ({why})."]
    lc, inf1 = best(rows["llama.cpp"], 1), None if hidden else best(rows["infer"], 1)
    if lc and inf1:
        lines += ["", f"Batch-1 decode, infer / llama.cpp: {inf1['decode_throughput'] / lc['decode_throughput']:.2f}x"]
    lines += quality_lines(quality)
    if serving:
        lines += ["", f"Serving ({args.concurrency} concurrent clients, random {args.input_len} in / "
                  f"{args.output_len} out):", "",
                  "| server | prompts | output tok/s | req/s | median TTFT (ms) | median ITL (ms) | p99 ITL (ms) | median E2E (s) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, s in serving.items():
            if s and not (hidden and name == "infer"):
                lines.append(f"| {name} | {s['completed']} | {s['output_throughput']:.1f} | "
                             f"{s['request_throughput']:.3f} | {s['ttft']['median_ms']:.0f} | "
                             f"{s['itl']['median_ms']:.1f} | {s['itl']['p99_ms']:.1f} | "
                             f"{s['e2e']['median_ms'] / 1000:.1f} |")
        vals = [s.get("output_throughput") for s in serving.values()]
        if len(vals) == 2 and all(vals) and not hidden:
            lines += ["", f"Serving output throughput, infer / transformers: {vals[0] / vals[1]:.2f}x"]
    lines += ["", "Commands (with load average before -> after):", ""]
    lines += [f"- `{e['cmd']}` rc {e['rc']}, {e['wall_s']} s, load {e['load_before']} -> {e['load_after']}"
              for e in summary["log"]]
    plot(summary, HERE / "cpu_results.png")
    lines += ["", "![CPU results](cpu_results.png)"]
    notes = HERE / "cpu_notes.md"
    if notes.exists():  # hand-written analysis of the committed run
        lines += ["", notes.read_text().strip()]
    lines += [END]
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    block = "\n".join(lines)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    print(block)


if __name__ == "__main__":
    main()
