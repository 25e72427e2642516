"""Applying a resolved step: sampled tokens into their requests, and why requests finish.

A step may give a request several tokens (``StepResult.sampled`` holds a list per request); they
are applied in order and the request stops at the first one that finishes it. Under overlap
scheduling the tokens replace the placeholders the step left (``-(row + 1)``, row of the step's
sampled rows, in order).

Finish reasons follow SGLang: {"type": "stop", "matched": <token id or stop string>},
{"type": "length", "length": <max_new_tokens>}, {"type": "abort", "message": ...}.
"""

from __future__ import annotations

import time
from typing import Any

from infer.core.engine.model_runner import LaunchedStep, StepResult
from infer.core.engine.request import Request


def apply_step(launched: LaunchedStep, res: StepResult, reqs: dict[str, Request],
               counters: dict[str, int]) -> list[tuple[Request, dict[str, Any]]]:
    """Record the step's prompt logprobs, sampled tokens and their logprobs; returns the requests
    that finish with their reasons (the caller finishes them). ``reqs``: live requests by rid."""
    for rid, rows in res.prompt_logprobs.items():
        req = reqs[rid]
        for pos, lp, top in rows:
            pad = pos - len(req.prompt_logprobs)
            req.prompt_logprobs.extend([None] * pad)
            req.prompt_top_logprobs.extend([None] * pad)
            req.prompt_logprobs.append(lp)
            req.prompt_top_logprobs.append(top)
    finished = []
    now = time.monotonic()
    row = 0  # sampled row of the step that the next token came from
    for req, toks in res.sampled:
        first_row, row = row, row + len(toks)
        if req.finished:
            continue  # aborted (or ended) while this step ran
        if req.params.max_new_tokens == 0:  # prefill only (e.g. for prompt logprobs)
            finished.append((req, {"type": "length", "length": 0}))
            continue
        lps, tops = res.logprobs.get(req.rid), res.top_logprobs.get(req.rid)
        for j, tok in enumerate(toks):
            n_out = _put(req, tok, first_row + j if launched.deferred else None)
            counters["generated_tokens"] += 1
            if req.first_token_time is None:
                req.first_token_time = now
            if req.return_logprob:
                req.output_logprobs.append(lps[j] if lps else 0.0)
                req.output_top_logprobs.append(tops[j] if tops else [])
            if req.grammar is not None:
                req.grammar.accept_token(tok)
            reason = finish_reason(req, tok, n_out)
            if reason is not None:
                finished.append((req, reason))
                break
    return finished


def _put(req: Request, tok: int, row: int | None) -> int:
    """Record one sampled token (in place of row ``row``'s placeholder when the step was
    deferred); returns how many output tokens the request now has."""
    if row is None:
        req.output_ids.append(tok)
        return len(req.output_ids)
    j = len(req.output_ids) - req.num_pending  # its oldest placeholder is this token's
    assert req.output_ids[j] == -(row + 1), (req.rid, j, req.output_ids[j], row)
    req.output_ids[j] = tok
    req.num_pending -= 1
    return j + 1


def finish_reason(req: Request, tok: int, n_out: int) -> dict[str, Any] | None:
    """Why the request ends with ``tok``, its ``n_out``-th output token (None: it goes on)."""
    p = req.params
    if n_out >= p.min_new_tokens:
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in req.eos_ids):
            return {"type": "stop", "matched": tok}
        if req.grammar is not None and req.grammar.is_terminated():
            return {"type": "stop", "matched": tok}
        if req.stop_checker is not None:
            req.stop_checker.add([tok])
            if req.stop_checker.matched is not None:
                return {"type": "stop", "matched": req.stop_checker.matched}
    elif req.stop_checker is not None:
        req.stop_checker.add([tok])
    if p.max_new_tokens is not None and n_out >= p.max_new_tokens:
        return {"type": "length", "length": p.max_new_tokens}
    if len(req.prompt_ids) + n_out >= req.max_total_len:
        return {"type": "length", "length": n_out}
    return None
