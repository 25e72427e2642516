"""Engine-level benchmarks: one batch (bench_one_batch) and offline throughput.

Both drive an ``EngineCore`` in this process with random token-id prompts (no tokenizer cost)
and ``ignore_eos`` so every request makes exactly its output length. The prefix cache is flushed
between runs and prompts are fresh random ids, so no run reuses another's KV.

One batch: all ``batch_size`` requests are added, then ``step()`` is timed until every request
has its first token (the prefill; several steps if chunked), and each later step is a decode step
making one token per running request.
"""

from __future__ import annotations

import random
import time
from typing import Any

from infer.cli.bench_data import random_id_requests, sample_lengths
from infer.cli.bench_metrics import offline_metrics, one_batch_metrics


def make_core(server_args: Any) -> Any:
    """The engine for ``server_args``; a model or setting it cannot take ends the command with
    exit code 2 and the reason, as ``infer generate`` does."""
    from infer.cli.common import fail
    from infer.core.config import ConfigError
    from infer.core.engine.engine_core import EngineCore

    try:
        return EngineCore(server_args)
    except (ConfigError, ValueError, NotImplementedError) as exc:
        fail(str(exc))


def make_ready_core(server_args: Any, rng: random.Random) -> Any:
    """An engine started as the server's engine process starts one (server/engine_proc.py): no
    garbage collection while it loads, then, after a warm-up, start-up's heap frozen
    (``gc_watch.freeze_startup_heap``), so that later collections walk only what the benchmark
    allocates: the engine alone runs in the state the server's engine serves in. Measured (the
    default model, 64 requests of 128 / 128, 32 running, three alternating pairs in one process):
    frozen against not 0.95x, 0.94x, 1.02x, the same within the machine's noise; the collections
    ``perf`` counted in an offline run (``gc_collect_main``, 2-4 % of its samples) were in its
    start-up, which this shortens, not in the timed part."""
    from infer.core.engine import gc_watch

    gc_watch.pause_for_startup()
    try:
        core = make_core(server_args)
        warmup(core, rng)
    finally:
        gc_watch.freeze_startup_heap()
    return core


def _add(core: Any, tag: str, reqs: list) -> list[str]:
    rids = []
    for i, r in enumerate(reqs):
        params = {"max_new_tokens": r.output_len, "ignore_eos": True, "temperature": 0.0}
        rids += core.add_request(core.make_request(f"{tag}-{i}", r.prompt_ids, params))
    return rids


def _drain(core: Any) -> None:
    while core.has_work():
        core.step()
    core.flush_cache()


def run_one_batch(core: Any, batch_size: int, input_len: int, output_len: int,
                  rng: random.Random, tag: str = "ob") -> dict[str, Any]:
    reqs = random_id_requests(core.arch.vocab_size, [(input_len, output_len)] * batch_size, rng)
    rids = set(_add(core, tag, reqs))
    have_token: set[str] = set()
    t0 = time.perf_counter()
    while have_token != rids:
        for out in core.step():
            if out.new_token_ids:
                have_token.add(out.rid)
    prefill = time.perf_counter() - t0
    steps = []
    while core.has_work():
        t = time.perf_counter()
        outs = core.step()
        if any(o.new_token_ids for o in outs):
            steps.append(time.perf_counter() - t)
    core.flush_cache()
    return one_batch_metrics(batch_size, input_len, output_len, prefill, steps)


def run_offline(core: Any, num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                rng: random.Random, progress: bool = True, tag: str = "off") -> dict[str, Any]:
    from tqdm.auto import tqdm

    lengths = sample_lengths(num_prompts, input_len, output_len, range_ratio, rng)
    reqs = random_id_requests(core.arch.vocab_size, lengths, rng)
    t0 = time.perf_counter()
    _add(core, tag, reqs)
    done = 0
    out_tokens = 0
    with tqdm(total=num_prompts, desc="offline", disable=not progress) as bar:
        while core.has_work():
            for out in core.step():
                out_tokens += len(out.new_token_ids)
                if out.finished:
                    done += 1
                    bar.update(1)
    duration = time.perf_counter() - t0
    core.flush_cache()
    result = offline_metrics(done, sum(r.input_len for r in reqs), out_tokens, duration)
    result.update({"input_len": input_len, "output_len": output_len, "range_ratio": range_ratio})
    return result


def warmup(core: Any, rng: random.Random) -> None:
    """One short request of each kind of step before timing anything."""
    _add(core, "warm", random_id_requests(core.arch.vocab_size, [(16, 4)], rng))
    _drain(core)
