"""How often ``EngineCore.step`` reports a request's new tokens (``Request.report_every``, which
the server sets from --stream-interval for streamed requests and to 0 for the others): the
first token at once, then a report once that many tokens are unreported, and the end at once.
The tokens, logprobs and finish reasons are those of reporting every token (1, the default)."""

from __future__ import annotations

import pytest
from helpers import random_prompts, run_all

PROMPTS = random_prompts(6, seed=11, lo=3, hi=40)
GREEDY = {"max_new_tokens": 11, "temperature": 0, "ignore_eos": True}


def reports(core, prompts, params, **req_kwargs):
    """{rid: [token counts of each report]} and {rid: (ids, last output)} over a whole run."""
    sizes: dict[str, list[int]] = {}
    res: dict[str, tuple[list[int], object]] = {}
    for i, p in enumerate(prompts):
        core.add_request(core.make_request(f"r{i}", p, params, **req_kwargs))
    steps = 0
    while core.has_work():
        for o in core.step():
            sizes.setdefault(o.rid, []).append(len(o.new_token_ids))
            ids, _ = res.get(o.rid, ([], None))
            res[o.rid] = (ids + list(o.new_token_ids), o)
        steps += 1
        assert steps < 10000
    return sizes, res


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("every", [2, 3, 0])
def test_cadence_and_same_tokens(make_core, every, overlap):
    flags = {"disable_overlap_schedule": not overlap}
    base = run_all(make_core(**flags), PROMPTS, GREEDY, return_logprob=True, top_logprobs_num=2)
    sizes, got = reports(make_core(**flags), PROMPTS, GREEDY, return_logprob=True,
                         top_logprobs_num=2, report_every=every)
    n = GREEDY["max_new_tokens"]
    for rid, (ids, last) in base.items():
        assert got[rid][0] == ids
        assert got[rid][1].finish_reason == last.finish_reason
        assert got[rid][1].completion_tokens == n
        s = sizes[rid]
        assert sum(s) == n
        assert s[0] == 1, "the first token is reported at once"
        if every == 0:
            assert s == [1, n - 1], "not streamed: the first token, then the rest at the end"
        elif not overlap:
            # one token a step: every report but the last holds exactly `every` tokens
            assert all(k == every for k in s[1:-1]) and 0 < s[-1] <= every, s
        else:
            assert all(k >= every for k in s[1:-1]), s


def test_logprobs_and_prompt_logprobs_arrive_whole(make_core):
    params = {**GREEDY, "max_new_tokens": 7}
    kw = {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}
    every_token: dict[str, list] = {}
    core = make_core()
    for i, p in enumerate(PROMPTS[:3]):
        core.add_request(core.make_request(f"r{i}", p, params, **kw))
    while core.has_work():
        for o in core.step():
            every_token.setdefault(o.rid, []).append(o)
    _, got = reports(make_core(), PROMPTS[:3], params, report_every=0, **kw)
    for rid, outs in every_token.items():
        last = got[rid][1]
        assert last.output_logprobs == [x for o in outs for x in o.output_logprobs][1:]
        assert last.output_top_logprobs == [x for o in outs for x in o.output_top_logprobs][1:]
        assert outs[0].prompt_logprobs is not None


def test_abort_and_end_report_at_once(make_core):
    core = make_core()
    core.add_request(core.make_request("long", PROMPTS[0], {**GREEDY, "max_new_tokens": 50},
                                       report_every=0))
    core.add_request(core.make_request("short", PROMPTS[1], {**GREEDY, "max_new_tokens": 4},
                                       report_every=100))
    seen: dict[str, list] = {}
    for _ in range(3):
        for o in core.step():
            seen.setdefault(o.rid, []).append(o)
    assert [len(o.new_token_ids) for o in seen["long"]] == [1]  # the first token only, so far
    assert core.abort("long")
    outs = core.step()
    for o in outs:
        seen.setdefault(o.rid, []).append(o)
    ab = [o for o in outs if o.rid == "long"]
    assert len(ab) == 1 and ab[0].finished and ab[0].finish_reason["type"] == "abort"
    assert len(ab[0].new_token_ids) >= 1  # what it had made since its first token
    while core.has_work():
        for o in core.step():
            seen.setdefault(o.rid, []).append(o)
    short = seen["short"]
    assert short[-1].finished and [len(o.new_token_ids) for o in short] == [1, 3]
