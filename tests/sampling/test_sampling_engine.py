"""Every sampling parameter through the EngineCore on the tiny fp32 Llama; each test compares
against a run where the parameter is absent (so it fails if the parameter were ignored) and,
where the result is defined exactly, against a transformers-logits reference."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from helpers import random_prompts, run_all

PROMPT = random_prompts(1, seed=3, lo=20, hi=21)[0]


def gen(core, params, prompt=PROMPT, **kw):
    res = run_all(core, [prompt], params, **kw)["r0"]
    return res[0], res[1]


@pytest.fixture(scope="module")
def core(make_core):
    return make_core(page_size=2)


def hf_penalised_greedy(hf, prompt, n, rep=1.0, freq=0.0, pres=0.0):
    ids = list(prompt)
    out = []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
        if rep != 1.0:
            seen = torch.tensor(sorted(set(ids)))
            v = logits[seen]
            logits[seen] = torch.where(v > 0, v / rep, v * rep)
        if out:
            counts = torch.bincount(torch.tensor(out), minlength=logits.shape[0]).float()
            logits = logits - freq * counts - pres * (counts > 0).float()
        tok = int(logits.argmax())
        out.append(tok)
        ids.append(tok)
    return out


def test_greedy_and_penalties_match_reference(core, tiny_model):
    hf = tiny_model[1]
    base = {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}
    plain = gen(core, base)[0]
    assert plain == hf_penalised_greedy(hf, PROMPT, 30)
    assert len(set(plain)) < len(plain)  # the plain output repeats, so penalties must bite
    for kw, ref in [({"repetition_penalty": 1.8}, {"rep": 1.8}),
                    ({"frequency_penalty": 2.0}, {"freq": 2.0}),
                    ({"presence_penalty": 2.0}, {"pres": 2.0})]:
        got = gen(core, {**base, **kw})[0]
        assert got == hf_penalised_greedy(hf, PROMPT, 30, **ref), kw
        assert got != plain, f"{kw} made no difference"


def test_temperature_seed_and_batch_independence(core):
    p = {"max_new_tokens": 12, "temperature": 1.5, "seed": 1234, "ignore_eos": True}
    a = gen(core, p)[0]
    assert a == gen(core, p)[0]
    assert a != gen(core, {**p, "seed": 99})[0]
    assert a != gen(core, {**p, "temperature": 0})[0]
    # same seed inside a batch of other (sampled) requests
    others = random_prompts(5, seed=9)
    core_out = run_all(core, [PROMPT] + others, p)
    assert core_out["r0"][0] == a


def test_top_k_top_p_min_p_force_greedy(core):
    greedy = gen(core, {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})[0]
    hot = {"max_new_tokens": 12, "temperature": 3.0, "seed": 5, "ignore_eos": True}
    assert gen(core, hot)[0] != greedy
    assert gen(core, {**hot, "top_k": 1})[0] == greedy
    assert gen(core, {**hot, "top_p": 1e-6})[0] == greedy
    assert gen(core, {**hot, "min_p": 1.0})[0] == greedy


def test_top_k_keeps_samples_in_top_k(core):
    p = {"max_new_tokens": 24, "temperature": 5.0, "seed": 2, "top_k": 3, "ignore_eos": True}
    ids, out = gen(core, p, return_logprob=True, top_logprobs_num=3)
    assert all(t in [tid for tid, _ in top] for t, top in zip(ids, out_top(core, p), strict=True))
    wide, _ = gen(core, {**p, "top_k": -1}, return_logprob=True, top_logprobs_num=3)
    tops = out_top(core, {**p, "top_k": -1})
    assert any(t not in [tid for tid, _ in top] for t, top in zip(wide, tops, strict=True))


def out_top(core, p):
    core.add_request(core.make_request("t", PROMPT, p, return_logprob=True, top_logprobs_num=3))
    tops = []
    while core.has_work():
        for o in core.step():
            tops.extend(o.output_top_logprobs)
    return tops


def test_max_min_new_tokens_stop_ids_and_ignore_eos(core):
    greedy = gen(core, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})[0]
    ids, out = gen(core, {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert ids == greedy[:5] and out.finish_reason == {"type": "length", "length": 5}
    stop = greedy[2]
    ids, out = gen(core, {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [stop]})
    assert ids == greedy[:3] and out.finish_reason == {"type": "stop", "matched": stop}
    ids, out = gen(core, {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [stop],
                          "min_new_tokens": 6})
    assert len(ids) >= 6 and stop not in ids[:6]
    saved = core.admission.eos_ids
    core.admission.eos_ids = (stop,)
    try:
        ids, out = gen(core, {"max_new_tokens": 8, "temperature": 0})
        assert ids == greedy[:3] and out.finish_reason["matched"] == stop
        ids, _ = gen(core, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert ids == greedy
    finally:
        core.admission.eos_ids = saved


def test_logprobs_match_transformers(core, tiny_model):
    hf = tiny_model[1]
    core.add_request(core.make_request("lp", PROMPT, {"max_new_tokens": 4, "temperature": 0,
                                                      "ignore_eos": True},
                                       return_logprob=True, top_logprobs_num=2, logprob_start_len=0))
    outs = []
    while core.has_work():
        outs.extend(core.step())
    ids = [t for o in outs for t in o.new_token_ids]
    lps = [x for o in outs for x in o.output_logprobs]
    prompt_lp = next(o.prompt_logprobs for o in outs if o.prompt_logprobs is not None)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([PROMPT + ids])).logits[0].float(), -1)
    n = len(PROMPT)
    for j, t in enumerate(ids):
        assert math.isclose(lps[j], float(ref[n - 1 + j, t]), abs_tol=1e-3)
    assert prompt_lp[0] == (PROMPT[0], None)
    for i in range(1, n):
        assert prompt_lp[i][0] == PROMPT[i]
        assert math.isclose(prompt_lp[i][1], float(ref[i - 1, PROMPT[i]]), abs_tol=1e-3)


def test_n_shares_prompt_pages(core):
    prompt = random_prompts(1, seed=11, lo=40, hi=41)[0]
    core.add_request(core.make_request("multi", prompt, {"max_new_tokens": 6, "temperature": 1.0,
                                                         "n": 3, "seed": 7, "ignore_eos": True}))
    got = {}
    while core.has_work():
        for o in core.step():
            got.setdefault(o.rid, []).append(o)
    assert sorted(got) == ["multi-0", "multi-1", "multi-2"]
    # all but the last prompt token, page-aligned (page_size 2): 38 of 40
    assert [o.cached_tokens for o in (got["multi-1"][-1], got["multi-2"][-1])] == [38, 38]
    outs = {tuple(t for o in v for t in o.new_token_ids) for v in got.values()}
    assert len(outs) > 1  # different seeds per choice


def test_grammar_regex_and_json_schema(core):
    tok = core.tokenizer
    ids, out = gen(core, {"max_new_tokens": 30, "temperature": 1.0, "seed": 3,
                          "regex": r"[0-9]{3}-[a-z]{2}"})
    text = tok.decode(ids, skip_special_tokens=True)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
    schema = json.dumps({"type": "object", "properties": {"v": {"type": "integer"}},
                         "required": ["v"], "additionalProperties": False})
    ids, out = gen(core, {"max_new_tokens": 40, "temperature": 0.7, "seed": 1, "json_schema": schema})
    assert out.finish_reason["type"] == "stop"
    obj = json.loads(tok.decode(ids, skip_special_tokens=True))
    assert isinstance(obj["v"], int)
    free = tok.decode(gen(core, {"max_new_tokens": 30, "temperature": 1.0, "seed": 3})[0])
    assert not re.fullmatch(r"[0-9]{3}-[a-z]{2}", free)
    with pytest.raises(ValueError, match="regex"):
        core.add_request(core.make_request("bad", PROMPT, {"regex": "("}))


def test_sampling_defaults_from_generation_config(tiny_model, make_core, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny_model[0], d)
    (d / "generation_config.json").write_text(json.dumps({"temperature": 2.0, "top_k": 1}))
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host

    def run(mode):
        c = EngineCore(ServerArgs(model_path=str(d), dtype="float32", max_total_tokens=2048,
                                  sampling_defaults=mode), platform=get_plugin_host().select("cpu"))
        return gen(c, {"max_new_tokens": 10, "seed": 4, "ignore_eos": True})[0]

    greedy = gen(make_core(), {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True})[0]
    assert run("model") == greedy  # top_k 1 from generation_config
    assert run("openai") != greedy  # temperature 1, no top_k


def test_max_new_tokens_zero_gives_prompt_logprobs_only(core):
    core.add_request(core.make_request("z", PROMPT, {"max_new_tokens": 0}, return_logprob=True,
                                       logprob_start_len=0))
    outs = []
    while core.has_work():
        outs.extend(core.step())
    (o,) = outs
    assert o.finished and o.new_token_ids == [] and o.completion_tokens == 0
    assert o.finish_reason == {"type": "length", "length": 0}
    assert len(o.prompt_logprobs) == len(PROMPT) and o.prompt_logprobs[1][1] is not None
