"""``infer bench``: one-batch, offline and serving benchmarks (SGLang's bench_one_batch,
bench_offline_throughput and bench_serving). Each prints a table, can write JSON
(``--result-file``) and a PNG (``--plot``)."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from infer.cli.common import ServerFlagsCommand, fail, with_server_flags
from infer.core.config import ServerArgs

app = typer.Typer(help="Benchmarks: one batch, offline throughput, serving.", no_args_is_help=True)

PlotOpt = Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG plot here.")]
ResultOpt = Annotated[Optional[Path], typer.Option("--result-file", help="Write results as JSON.")]


def _emit(kind: str, results: list[dict[str, Any]], result_file: Path | None, extra: dict[str, Any]) -> None:
    for r in results:
        typer.echo(json.dumps(r, default=str))
    if result_file is not None:
        result_file.parent.mkdir(parents=True, exist_ok=True)
        result_file.write_text(json.dumps({"bench": kind, **extra, "results": results}, indent=2,
                                          default=str))
        typer.echo(f"results written to {result_file}")


def _check_lengths(*values: int) -> None:
    if any(v < 1 for v in values):
        fail("lengths, batch sizes and counts must be at least 1")


@app.command("one-batch", cls=ServerFlagsCommand)
@with_server_flags
def one_batch(
    batch_size: Annotated[list[int], typer.Option("--batch-size", help="Repeat for a sweep.")] = [1],  # noqa: B006
    input_len: Annotated[int, typer.Option("--input-len")] = 128,
    output_len: Annotated[int, typer.Option("--output-len")] = 128,
    runs: Annotated[int, typer.Option("--runs", help="Runs per batch size; the best is kept.")] = 1,
    result_file: ResultOpt = None, plot: PlotOpt = None,
    *, server_args: ServerArgs,
) -> None:
    """Prefill latency and decode throughput of one static batch per batch size."""
    from infer.cli.bench_engine import make_ready_core, run_one_batch

    _check_lengths(input_len, output_len, runs, *batch_size)
    rng = random.Random(0)
    core = make_ready_core(server_args, rng)
    results = []
    for bs in batch_size:
        best = max((run_one_batch(core, bs, input_len, output_len, rng, tag=f"b{bs}r{i}")
                    for i in range(runs)), key=lambda r: r["decode_throughput"])
        typer.echo(f"batch {bs}: prefill {best['prefill_latency_s'] * 1000:.1f} ms, decode "
                   f"{best['decode_throughput']:.1f} tok/s", err=True)
        results.append(best)
    _emit("one-batch", results, result_file, {"model_path": server_args.model_path})
    if plot is not None:
        from infer.cli.bench_plot import plot_series

        plot_series(plot, "batch size", {"infer": [(r["batch_size"], r) for r in results]},
                    "decode_throughput", "prefill_latency_s", "prefill latency (s)",
                    f"one batch, {input_len} in / {output_len} out")


@app.command("offline", cls=ServerFlagsCommand)
@with_server_flags
def offline(
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 64,
    input_len: Annotated[int, typer.Option("--input-len")] = 128,
    output_len: Annotated[int, typer.Option("--output-len")] = 128,
    range_ratio: Annotated[float, typer.Option("--range-ratio", help="Lengths uniform in [len*ratio, len].")] = 1.0,
    result_file: ResultOpt = None,
    *, server_args: ServerArgs,
) -> None:
    """N prompts through the engine at once; request and token throughput."""
    from infer.cli.bench_engine import make_ready_core, run_offline

    _check_lengths(num_prompts, input_len, output_len)
    if not 0 < range_ratio <= 1:
        fail("--range-ratio must be in (0, 1]")
    rng = random.Random(0)
    core = make_ready_core(server_args, rng)
    result = run_offline(core, num_prompts, input_len, output_len, range_ratio, rng)
    _emit("offline", [result], result_file, {"model_path": server_args.model_path})


@app.command("quality", cls=ServerFlagsCommand)
@with_server_flags
def quality(
    windows: Annotated[int, typer.Option("--windows", help="Windows of the pydoc_data text.")] = 8,
    window_len: Annotated[int, typer.Option("--window-len", help="Tokens per window.")] = 256,
    extend_len: Annotated[int, typer.Option("--extend-len", help="Chunk of the extend mode.")] = 16,
    mode: Annotated[list[str], typer.Option("--mode", help="prefill, extend, decode; repeat (default: all).")] = [],  # noqa: B006
    reference: Annotated[bool, typer.Option("--reference/--no-reference", help="KL against the float32 reference.")] = True,
    result_file: ResultOpt = None,
    *, server_args: ServerArgs,
) -> None:
    """Perplexity and KL divergence to a float32 reference of the same weights, over the
    documentation strings of Python's pydoc_data, through the serving paths (prefill, extends
    after prefix-cache hits, decode steps)."""
    from infer.cli.bench_quality import MODES, run_quality

    _check_lengths(windows, extend_len)
    if window_len < 2:
        fail("--window-len must be at least 2")
    bad = [m for m in mode if m not in MODES]
    if bad:
        fail(f"--mode {bad[0]}: use one of {', '.join(MODES)}")
    try:
        rows = run_quality(server_args, windows, window_len, extend_len, mode or list(MODES),
                           reference)
    except ValueError as exc:
        fail(str(exc))
    for r in rows:
        kl = f", KL {r['kl_mean']:.2e}, top-1 {r['top1_agree']:.3f}" if "kl_mean" in r else ""
        typer.echo(f"{r['path']} {r['mode']}: perplexity {r['perplexity']:.4f} over "
                   f"{r['tokens']} tokens{kl}", err=True)
    _emit("quality", rows, result_file, {"model_path": server_args.model_path})


@app.command("serving")
def serving(
    base_url: Annotated[str, typer.Option("--base-url", help="OpenAI-compatible server.")] = "http://127.0.0.1:30000",
    model: Annotated[Optional[str], typer.Option("--model", help="Model name (default: the server's first).")] = None,
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Local tokenizer: HF folder, .gguf or smollm2.")] = "smollm2",
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 64,
    input_len: Annotated[int, typer.Option("--input-len")] = 128,
    output_len: Annotated[int, typer.Option("--output-len")] = 128,
    range_ratio: Annotated[float, typer.Option("--range-ratio")] = 1.0,
    request_rate: Annotated[float, typer.Option("--request-rate", help="Requests/s (Poisson); inf: all at once.")] = math.inf,
    max_concurrency: Annotated[list[int], typer.Option("--max-concurrency", help="Repeat for a sweep.")] = [],  # noqa: B006
    seed: Annotated[int, typer.Option("--seed", help="Prompt seed; a sweep's row i uses seed + i. Runs "
                                         "against the same server should use different seeds, or the "
                                         "later ones hit its prefix cache.")] = 0,
    result_file: ResultOpt = None, plot: PlotOpt = None,
    disable_tqdm: Annotated[bool, typer.Option("--disable-tqdm")] = False,
) -> None:
    """Stream completions from a running server; TTFT, ITL, E2E and throughput."""
    from infer.cli.bench_data import load_tokenizer, random_requests, sample_lengths
    from infer.cli.bench_serving import run_serving, served_model

    _check_lengths(num_prompts, input_len, output_len, *max_concurrency)
    if not 0 < range_ratio <= 1:
        fail("--range-ratio must be in (0, 1]")
    if request_rate <= 0:
        fail("--request-rate must be positive (inf for all at once)")
    try:
        tok = load_tokenizer(tokenizer)
    except (OSError, ValueError) as exc:
        fail(f"--tokenizer {tokenizer}: {exc}")
    try:
        name = model or asyncio.run(served_model(base_url))
    except Exception as exc:  # noqa: BLE001  # any connection / protocol failure ends the same way
        fail(f"--base-url {base_url}: cannot list models ({type(exc).__name__}: {exc})")
    results = []
    for i, conc in enumerate(max_concurrency or [None]):
        # each row of a sweep its own prompts (seed + i): a row reusing an earlier row's prompts
        # would find them in the server's prefix cache
        rng = random.Random(seed + i)
        reqs = random_requests(tok, sample_lengths(num_prompts, input_len, output_len, range_ratio, rng), rng)
        res = asyncio.run(run_serving(base_url, name, reqs, tok, request_rate=request_rate,
                                      max_concurrency=conc, seed=seed, progress=not disable_tqdm))
        typer.echo(f"concurrency {conc}: {res['output_throughput']:.1f} out tok/s, median TTFT "
                   f"{res['ttft']['median_ms']:.0f} ms, median ITL {res['itl']['median_ms']:.1f} ms, "
                   f"{res['failed']} failed", err=True)
        results.append(res)
    _emit("serving", results, result_file, {"base_url": base_url})
    if plot is not None:
        from infer.cli.bench_plot import plot_series

        plot_series(plot, "max concurrency", {name: [(r["max_concurrency"] or num_prompts, r)
                                                     for r in results]},
                    "output_throughput", "itl", "median inter-token latency (ms)",
                    f"serving, {input_len} in / {output_len} out")
