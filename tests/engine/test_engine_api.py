"""The offline Engine (SGLang's shapes), streaming, async, stop strings, abort, queue limits,
flush, and the `infer generate` command."""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import random_prompts, run_all
from infer.core.engine.request import QueueFullError
from typer.testing import CliRunner

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model):
    from infer.core import Engine

    eng = Engine(model_path=str(tiny_model[0]), max_total_tokens=4096, chunked_prefill_size=32,
                 page_size=4)
    yield eng
    eng.shutdown()


def test_generate_shapes_and_matches_core(engine, make_core):
    one = engine.generate(prompt="Hello world", sampling_params=GREEDY)
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["completion_tokens"] == 12 and meta["prompt_tokens"] == len(engine.tokenizer.encode("Hello world"))
    assert one["text"] == engine.tokenizer.decode(one["output_ids"], skip_special_tokens=True)
    many = engine.generate(prompt=["Hello world", "The quick brown"],
                           sampling_params=[GREEDY, {**GREEDY, "max_new_tokens": 3}])
    assert isinstance(many, list) and many[0]["output_ids"] == one["output_ids"]
    assert len(many[1]["output_ids"]) == 3
    ids = random_prompts(2, seed=5)
    by_ids = engine.generate(input_ids=ids, sampling_params=GREEDY)
    core = make_core(dtype="auto")  # same dtype as the engine: the checkpoint's fp32 -> fp16
    ref = run_all(core, ids, GREEDY)
    assert [r["output_ids"] for r in by_ids] == [ref["r0"][0], ref["r1"][0]]


def test_stream_equals_non_stream(engine):
    full = engine.generate(prompt="The quick brown", sampling_params=GREEDY)
    chunks = list(engine.generate(prompt="The quick brown", sampling_params=GREEDY, stream=True))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert all(a["output_ids"] == b["output_ids"][:len(a["output_ids"])]
               for a, b in zip(chunks, chunks[1:], strict=False))  # cumulative, as SGLang
    assert sum(c["meta_info"]["finish_reason"] is not None for c in chunks) == 1
    engine.stream_output = True  # --stream-output: disjoint segments
    try:
        parts = list(engine.generate(prompt="The quick brown", sampling_params=GREEDY, stream=True))
    finally:
        engine.stream_output = False
    assert "".join(c["text"] for c in parts) == full["text"]
    assert [t for c in parts for t in c["output_ids"]] == full["output_ids"]


def test_async_generate_and_stream(engine):
    async def main():
        a, b = await asyncio.gather(
            engine.async_generate(prompt="Hello world", sampling_params=GREEDY),
            engine.async_generate(prompt="The quick brown", sampling_params=GREEDY))
        gen = await engine.async_generate(prompt="Hello world", sampling_params=GREEDY, stream=True)
        text = [c["text"] async for c in gen][-1]
        return a, b, text

    a, b, text = asyncio.run(main())
    assert a["output_ids"] == engine.generate(prompt="Hello world", sampling_params=GREEDY)["output_ids"]
    assert text == a["text"] and b["meta_info"]["completion_tokens"] == 12


def test_stop_strings_do_not_leak(engine):
    base = engine.generate(prompt="Hello world", sampling_params={**GREEDY, "max_new_tokens": 24})
    text = base["text"]
    stop = next(text[i:i + 2] for i in range(3, len(text) - 2)
                if text[i:i + 2].strip() and "\ufffd" not in text[i:i + 2])
    cut = text[:text.index(stop)]
    res = engine.generate(prompt="Hello world", sampling_params={**GREEDY, "max_new_tokens": 24,
                                                                 "stop": [stop]})
    assert res["text"] == cut and stop not in res["text"]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = engine.generate(prompt="Hello world", sampling_params={**GREEDY, "max_new_tokens": 24,
                                                                  "stop": [stop], "no_stop_trim": True})
    assert kept["text"] == cut + stop


def test_abort_queue_full_and_flush(tiny_model, make_core):
    core = make_core(max_queued_requests=2)
    core.add_request(core.make_request("a", [5, 6, 7], GREEDY))
    core.add_request(core.make_request("b", [5, 6, 8], GREEDY))
    with pytest.raises(QueueFullError, match="queue is full"):
        core.add_request(core.make_request("c", [5, 6, 9], GREEDY))
    core.step()
    assert core.abort("a") and core.abort("b") and not core.abort("zzz")
    outs = core.step()
    assert {o.rid: o.finish_reason["type"] for o in outs} == {"a": "abort", "b": "abort"}
    assert not core.has_work()
    s = core.stats()
    assert s.pages_free + s.pages_cached == s.pages_total
    assert core.flush_cache() and core.stats().pages_cached == 0
    assert core.stats().pages_free == s.pages_total
    with pytest.raises(ValueError, match="input_ids"):
        core.add_request(core.make_request("big", [1] * 5000, GREEDY))
    with pytest.raises(ValueError, match="temperature"):
        core.make_request("bad", [1, 2], {"temperature": -1})


def test_abort_while_streaming_frees_pages(engine):
    it = engine.generate(prompt="Hello world", sampling_params={**GREEDY, "max_new_tokens": 100},
                         stream=True)
    next(it)
    it.close()  # the consumer goes away: the request is aborted
    engine._pump()
    s = engine.get_stats()
    assert s.running == 0 and s.pages_free + s.pages_cached == s.pages_total


def test_cli_generate(tiny_model):
    from infer.cli.main import app

    runner = CliRunner()
    args = ["generate", "--model-path", str(tiny_model[0]), "--prompt", "Hello", "--prompt", "The",
            "--max-new-tokens", "5", "--temperature", "0", "--page-size", "2"]
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.strip().splitlines() if x.startswith("{")]
    assert [x["prompt"] for x in lines] == ["Hello", "The"]
    assert all(x["meta_info"]["completion_tokens"] <= 5 for x in lines)
    bad = runner.invoke(app, ["generate", "--model-path", str(tiny_model[0]), "--prompt", "x",
                              "--top-p", "7"])
    assert bad.exit_code == 2 and "top_p" in bad.output


def test_n_choices_abort_by_original_rid_and_rid_reuse(make_core):
    core = make_core()
    p = {**GREEDY, "n": 3, "temperature": 1.0, "seed": 1}
    assert core.add_request(core.make_request("g", [5, 6, 7], p)) == ["g-0", "g-1", "g-2"]
    with pytest.raises(ValueError, match="rid"):
        core.add_request(core.make_request("g", [5, 6, 7], p))
    core.step()
    assert core.abort("g")
    outs = core.step()
    assert sorted(o.rid for o in outs if o.finish_reason["type"] == "abort") == ["g-0", "g-1", "g-2"]
    assert run_all(core, [[5, 6, 7]], p)  # rid "r0"; and "g" is free again:
    core.add_request(core.make_request("g", [5, 6, 7], {**GREEDY, "n": 2}))
    while core.has_work():
        core.step()
    assert not core.table.groups and not core.table.parent
    with pytest.raises(ValueError, match="regex"):
        core.add_request(core.make_request("s", [5], {"stop": ["x"], "n": 2, "regex": "("}))
    assert not core.has_work()  # nothing half-queued


def test_n_choices_survive_abort_of_the_first(make_core):
    core = make_core()
    core.add_request(core.make_request("g", [5, 6, 7, 8], {**GREEDY, "n": 3}))
    assert core.abort("g-0")  # before it ran: the other choices must not wait for it forever
    done = {}
    for _ in range(200):
        for o in core.step():
            if o.finished:
                done[o.rid] = o.finish_reason["type"]
        if not core.has_work():
            break
    assert done == {"g-0": "abort", "g-1": "length", "g-2": "length"}
