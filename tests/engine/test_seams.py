"""The seams the engine grows on: settings views, the executor, several tokens per request per
step, rolling back a request's KV tail, and the model package not importing the engine."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from infer.core.cache.manager import KVManager
from infer.core.cache.page_pool import PagePool
from infer.core.cache.plain_cache import PlainCache
from infer.core.cache.radix_cache import RadixCache
from infer.core.config import ServerArgs
from infer.core.config.views import EngineConfig, GraphConfig
from infer.core.engine.finish import apply_step
from infer.core.engine.model_runner import LaunchedStep, StepResult
from infer.core.engine.request import Request, RequestState
from infer.core.engine.scheduler import ScheduleBatch, ScheduledSeq

ROOT = Path(__file__).resolve().parents[2]


# -- settings views ------------------------------------------------------------------------------
def test_views_resolve_unset_flags_once():
    cfg = EngineConfig.from_server_args(ServerArgs(model_path="m"))
    assert cfg.scheduler.max_running_requests == 256 and cfg.load.max_batch_size == 256
    assert cfg.scheduler.chunked_prefill_size == 8192
    assert cfg.cache.page_size == 1 and cfg.cache.mem_fraction == 0.8
    assert cfg.grammar_backend == "xgrammar" and cfg.overlap_schedule
    assert cfg.parallel.world_size == 1 and cfg.speculative.tokens_per_step == 1
    set_ = EngineConfig.from_server_args(ServerArgs(
        model_path="m", max_running_requests=7, page_size=4, cuda_graph_bs=[2, 1],
        disable_overlap_schedule=True, tp_size=2, dtype="float32"))
    assert set_.scheduler.max_running_requests == 7 and set_.load.max_batch_size == 7
    assert set_.cache.page_size == 4 and set_.load.page_size == 4
    assert set_.graph == GraphConfig(batch_sizes=[2, 1], max_running_requests=7,
                                     piecewise_max_tokens=4096, chunked_prefill_size=None)
    assert not set_.overlap_schedule and set_.parallel.tp_size == 2
    assert set_.load.dtype_explicit and not cfg.load.dtype_explicit


def test_engine_components_read_no_server_args():
    """Past the edge (views, gate, the offline Engine's own flags) nothing reads a ServerArgs
    with getattr: components get typed views."""
    offenders = []
    for path in (ROOT / "core" / "engine").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and \
                    isinstance(node.args[0], ast.Name) and "args" in node.args[0].id:
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders


def test_request_carries_no_runner_state():
    names = {f.name for f in fields(Request)}
    assert not names & {"page_table", "pages_dirty"}


def test_model_package_does_not_import_the_engine():
    code = ("import sys\nimport infer.core.model.models.llama, infer.core.model.layers.attention\n"
            "bad = [m for m in sys.modules if m.startswith('infer.core.engine')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- KV tail roll-back ---------------------------------------------------------------------------
class _Holder:
    def __init__(self, ids):
        self.all_ids = list(ids)
        self.pages: list[int] = []
        self.num_prefix_pages = 0
        self.cache_handle = None
        self.num_computed = 0


@pytest.mark.parametrize("cache_cls", [PlainCache, RadixCache])
def test_truncate_frees_the_tail_and_keeps_the_prefix(cache_cls):
    pool = PagePool(32, 4)
    kv = KVManager(pool, cache_cls(pool))
    first = _Holder(range(1, 10))
    kv.attach_prefix(first)
    assert kv.reserve(first, 9)
    first.num_computed = 9
    kv.release(first)  # its 2 whole pages go to the cache (radix) or back to the pool
    h = _Holder(list(range(1, 10)) + [50, 51, 52, 53, 54, 55, 56])
    kv.attach_prefix(h)
    prefix = h.num_prefix_pages
    assert kv.reserve(h, 16)
    h.num_computed = 16
    assert kv.take_changed(h) == 0
    free = pool.num_free
    kv.truncate(h, 9)  # keep 9 tokens: 3 pages
    assert h.num_computed == 9 and len(h.pages) == 3 and pool.num_free == free + 1
    assert kv.take_changed(h) == 3  # the runner's copy is still right up to the new end
    kv.truncate(h, 12)  # growing back is reserve's job: nothing changes
    assert h.num_computed == 9 and len(h.pages) == 3
    if prefix:
        with pytest.raises(ValueError, match="cached prefix"):
            kv.truncate(h, prefix * 4 - 1)
    kv.release(h)
    assert pool.num_free + kv.cache.cached_pages == pool.capacity


def test_take_changed_marks_reserved_pages():
    pool = PagePool(16, 2)
    kv = KVManager(pool, PlainCache(pool))
    h = _Holder(range(10))
    kv.attach_prefix(h)
    kv.reserve(h, 4)
    assert kv.take_changed(h) == 0 and kv.take_changed(h) == 2
    kv.reserve(h, 8)
    assert kv.take_changed(h) == 2


# -- several tokens per request per step ---------------------------------------------------------
def _running(rid, prompt, **params):
    from infer.core.sampling.params import SamplingParams

    r = Request(rid=rid, prompt_ids=list(prompt), params=SamplingParams(**params))
    r.state = RequestState.RUNNING
    r.eos_ids = (2,)
    return r


def test_apply_step_takes_a_list_of_tokens_per_request():
    a = _running("a", [5, 6], max_new_tokens=10)
    b = _running("b", [7], max_new_tokens=10)
    step = LaunchedStep(ScheduleBatch([ScheduledSeq(a, 1, 3), ScheduledSeq(b, 1, 3)]), [], StepResult())
    res = StepResult(sampled=[(a, [11, 12, 13]), (b, [21, 2, 23])])
    counters = {"generated_tokens": 0}
    finished = apply_step(step, res, {"a": a, "b": b}, counters)
    assert a.output_ids == [11, 12, 13]
    assert b.output_ids == [21, 2] and finished == [(b, {"type": "stop", "matched": 2})]
    assert counters["generated_tokens"] == 5


def test_apply_step_fills_placeholders_by_sampled_row():
    a = _running("a", [5], max_new_tokens=10)
    b = _running("b", [7], max_new_tokens=10)
    # a deferred step sampled rows 0, 1 for a and row 2 for b: placeholders -1, -2 and -3
    a.output_ids, a.num_pending = [-1, -2], 2
    b.output_ids, b.num_pending = [-3], 1
    step = LaunchedStep(ScheduleBatch(), [a, a, b], StepResult(), deferred=True)
    apply_step(step, StepResult(sampled=[(a, [8, 9]), (b, [4])]), {"a": a, "b": b},
               {"generated_tokens": 0})
    assert a.output_ids == [8, 9] and b.output_ids == [4] and a.num_pending == b.num_pending == 0
    a.output_ids, a.num_pending = [-1], 1
    b.output_ids, b.num_pending = [-1], 1  # row 1's token would land on row 0's placeholder
    with pytest.raises(AssertionError):
        apply_step(LaunchedStep(ScheduleBatch(), [a, b], StepResult(), deferred=True),
                   StepResult(sampled=[(a, [1]), (b, [3])]), {}, {"generated_tokens": 0})


def test_runner_samples_the_last_k_rows_of_a_span(make_core):
    """A prefill span sampled at its last 2 rows gives the greedy next token after prompt[:-1]
    and after the whole prompt, the same tokens one-token steps give."""
    core = make_core(disable_overlap_schedule=True, disable_radix_cache=True)
    prompt = [11, 42, 7, 99, 5, 64, 23]

    def first_token(ids):
        req = core.make_request(f"p{len(ids)}", ids, {"max_new_tokens": 1, "temperature": 0})
        core.add_request(req)
        out = []
        while core.has_work():
            out += [t for o in core.step() for t in o.new_token_ids]
        return out[0]

    expect = [first_token(prompt[:-1]), first_token(prompt)]
    req = core.make_request("two", prompt, {"max_new_tokens": 4, "temperature": 0})
    core.kv.attach_prefix(req)
    assert core.kv.reserve(req, len(prompt))
    batch = ScheduleBatch([ScheduledSeq(req, len(prompt), num_sample=2)], is_prefill=True)
    res = core.executor.resolve(core.executor.launch(batch, False))
    assert res.sampled == [(req, expect)]
    core.kv.release(req, cache=False)
    core.executor.forget(req.rid)


def test_n_choices_near_the_seed_limit_stay_in_range(make_core):
    core = make_core()
    req = core.make_request("s", [5, 6, 7], {"max_new_tokens": 1, "n": 3, "seed": (1 << 63) - 2})
    core.add_request(req)
    seeds = [core.table.reqs[f"s-{i}"].seed for i in range(3)]
    assert seeds == [(1 << 63) - 2, (1 << 63) - 1, -(1 << 63)]
    while core.has_work():
        core.step()
