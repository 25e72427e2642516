"""Where the GPU time of one step goes: kernel-level breakdown of a batch-1 decode step and a
128-token prefill of the Llama-3-8B shape, plus each GEMM shape's achieved bandwidth at M=1.

    python benchmarks/gpu/profile_kernels.py [--enable-torch-compile] [--out DIR]
    python benchmarks/gpu/profile_kernels.py --gemv [--gemv-rows 1 4 8] [--gemv-fp8]   (GEMV tables)

Prints, per phase, the summed kernel time against the wall time (their gap is host launch
cost) and the top kernels by total GPU time; then cuBLAS bf16 GEMV (M=1) per weight shape
as GB/s of weight read against the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def kernel_table(prof) -> list[tuple[str, float, int]]:
    """Every kernel name with its summed device time (us) and launch count, largest first."""
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t, n = rows.get(e.name, (0.0, 0))
            rows[e.name] = (t + e.time_range.elapsed_us(), n + 1)
    return sorted(((k, t, n) for k, (t, n) in rows.items()), key=lambda r: -r[1])


def show(tag: str, prof, wall_ms: float, reps: int, top: int = 14) -> dict:
    table = kernel_table(prof)
    ranked = table[:top]
    per = sum(t for _, t, _ in table) / reps / 1e3
    print(f"\n== {tag}: kernels {per:.3f} ms per run, wall {wall_ms:.3f} ms per run "
          f"(host gap {wall_ms - per:.3f} ms); kernels per run "
          f"{sum(n for _, _, n in table) / reps:.0f}")
    for name, t, n in ranked:
        print(f"  {t / reps / 1e3:8.3f} ms  x{n // reps:<4d} {name[:110]}")
    return {"kernel_ms": per, "wall_ms": wall_ms,
            "top": [(n_, t / reps / 1e3, c // reps) for n_, t, c in ranked]}


def gemv_vs_cublas(cfg: dict, bw: float, rows: list[int], fp8: bool = False) -> list[tuple]:
    """Per weight shape of one layer (and lm_head), cuBLAS against the best Triton GEMV config,
    each timed as ``infer_cuda.kernels.gemv.pick`` times them: a CUDA graph of back-to-back calls
    over weight copies that together exceed twice the L2 cache. ``fp8``: fp8 weights with
    per-channel scales, the peer being ``--quantization fp8``'s quantize + _scaled_mm path."""
    from infer_cuda.kernels.gemv import time_choices
    from infer_cuda.ops.linear_fp8 import scaled_mm_baseline

    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    shapes = {"qkv_proj": ((cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd, h),
              "o_proj": (h, h), "gate_up_proj": (2 * inter, h), "down_proj": (h, inter),
              "lm_head": (cfg["vocab_size"], h)}
    kind = "fp8 weights (peer: quantize + _scaled_mm)" if fp8 else "bf16 (peer: cuBLAS)"
    print(f"\n== GEMV x[M,K] @ W[N,K]^T, {kind}, vs the best Triton config (graph-timed, weights "
          "from HBM); GB/s of weight read, fraction of copy bw", flush=True)
    out = []
    dev = torch.device("cuda")
    for m in rows:
        for name, (n, k) in shapes.items():
            if fp8:
                w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
                scale = torch.rand(n, device=dev) + 0.5
                times = time_choices(m, n, k, torch.bfloat16, dev, weight=w, weight_scale=scale,
                                     baseline=scaled_mm_baseline)
            else:
                times = time_choices(m, n, k, torch.bfloat16, dev)
            cublas = times.pop("cublas")
            best = min(times, key=times.get)
            mb = n * k * (1 if fp8 else 2) / 1e6  # weight megabytes: MB / ms = GB/s
            print(f"  M={m} {name:<12} [{n:>6},{k:>5}]  cuBLAS {cublas * 1e3:7.1f} us "
                  f"{mb / cublas:5.0f} GB/s ({mb / cublas * 1e9 / bw:.2f})  Triton "
                  f"{times[best] * 1e3:7.1f} us {mb / times[best]:5.0f} GB/s "
                  f"({mb / times[best] * 1e9 / bw:.2f}) {best}  cuBLAS/Triton {cublas / times[best]:.2f}",
                  flush=True)
            print("      us per config: " + "  ".join(
                f"{c}={t * 1e3:.1f}" for c, t in sorted(times.items(), key=lambda ct: ct[1])))
            out.append((m, name, n, k, cublas, times[best], str(best)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--enable-torch-compile", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--gemv", action="store_true",
                    help="only time cuBLAS against the Triton GEMV per weight shape, then exit")
    ap.add_argument("--gemv-rows", type=int, nargs="+", default=[1], help="M values for --gemv")
    ap.add_argument("--gemv-fp8", action="store_true", help="with --gemv: fp8 weights too")
    a = ap.parse_args()
    import bench_engine as be  # noqa: E402 (same folder)
    from infer.core.config import ServerArgs
    from infer.core.config.gate import apply_platform_defaults
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.models.base import DecoderOnlyLM
    from infer.core.plugins import get_plugin_host

    cfg = be.SHAPES["llama3-8b"]
    model_dir = Path(tempfile.mkdtemp(prefix="infer-prof-"))
    (model_dir / "config.json").write_text(json.dumps(cfg))
    bw = be.measure_bandwidth()
    print(f"{torch.cuda.get_device_name()}  D2D {bw / 1e9:.0f} GB/s", flush=True)
    if a.gemv:
        rows = gemv_vs_cublas(cfg, bw, a.gemv_rows)
        if a.gemv_fp8:
            rows += gemv_vs_cublas(cfg, bw, a.gemv_rows, fp8=True)
        if a.out:
            Path(a.out).write_text(json.dumps({"bw": bw, "gemv_vs_cublas": rows}, indent=1))
        return
    DecoderOnlyLM.init_dummy_weights = be.device_dummy_init
    args = ServerArgs(model_path=str(model_dir), load_format="dummy", dtype="bfloat16", device="cuda",
                      skip_tokenizer_init=True, attention_backend="triton", cuda_graph_bs=[1],
                      max_running_requests=4, enable_torch_compile=a.enable_torch_compile,
                      torch_compile_max_bs=1, max_total_tokens=8192)
    platform = get_plugin_host().select("cuda")
    apply_platform_defaults(args, platform)
    core = EngineCore(args, platform=platform)
    report = {"bw": bw}

    # -- GEMV per weight shape ---------------------------------------------------------------
    from triton.testing import do_bench

    print("\n== cuBLAS bf16 x[1,K] @ W[N,K]^T (4 rotating weight copies, median)")
    for name, mod in core.loaded.model.named_modules():
        if not name.startswith("model.layers.0.") and name != "lm_head":
            continue
        w = getattr(mod, "weight", None)
        if w is None or w.dim() != 2:
            continue
        n, k = w.shape
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        i = [0]

        def f(ws=ws, x=x, i=i):
            i[0] = (i[0] + 1) % 4
            return torch.nn.functional.linear(x, ws[i[0]])

        ms = do_bench(f, warmup=25, rep=100, return_mode="median")
        gbs = n * k * 2 / ms / 1e6
        print(f"  {name:<34} [{n:>6},{k:>5}] {ms * 1e3:8.1f} us  {gbs:7.0f} GB/s  "
              f"({gbs * 1e9 / bw:.2f} of copy bw)")
        report.setdefault("gemv", []).append((name, n, k, ms, gbs))
        del ws

    # -- decode step (bs 1): the captured forward, run eagerly, under the profiler ------------
    gr = core.runner.graph_runner
    fwd = gr.static[1]
    model = gr._forward_for(1)
    core.runner.attn_backend.plan(fwd.attn)
    with torch.inference_mode():
        for _ in range(3):
            model(fwd)
        torch.cuda.synchronize()
        reps = 10
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                model(fwd)
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            gr.graphs[1].replay()
        torch.cuda.synchronize()
        replay = (time.perf_counter() - t0) / reps * 1e3
    report["decode"] = show("decode bs=1 (kernels as in the graph; wall = graph replay)", prof, replay, reps)

    # -- prefill of 128 tokens, eager ---------------------------------------------------------
    g = torch.Generator().manual_seed(0)

    def prefill_once(tag: str) -> float:
        ids = torch.randint(10, cfg["vocab_size"] - 10, (128,), generator=g).tolist()
        core.add_request(core.make_request(tag, ids, {"max_new_tokens": 1, "temperature": 0.0}))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while core.has_work():
            core.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    for i in range(3):
        prefill_once(f"w{i}")
    walls = [prefill_once(f"t{i}") for i in range(5)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        prefill_once("p")
    report["prefill"] = show("prefill 128 tokens + 1 sample (eager)", prof, sorted(walls)[2], 1)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
