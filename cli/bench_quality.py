"""Quality of the serving paths: perplexity, and the KL divergence of next-token distributions
against a float32 reference of the same weights.

Text: the documentation strings of Python's ``pydoc_data.topics`` (every Python has them), joined
in sorted key order and tokenized once; ``windows`` slices of ``window_len`` tokens spread evenly
over it. In every window, position p < window_len - 1 is scored: the model's next-token
distribution there against the text's token p + 1. Every mode scores the same positions.

Modes send the windows through an ``EngineCore`` as real requests (all windows at once, so the
scheduler batches them, the prefix cache serves them and the runner picks the kernels as it does
when serving):

- ``prefill``: each window is one prompt (``max_new_tokens`` 0, prompt logprobs from position 0).
- ``extend``: each window in chunks of ``extend_len`` tokens: request k's prompt is
  ``window[:(k + 1) e]`` with prompt logprobs from ``k e``, so its first ``k e`` tokens are a
  prefix-cache hit left by request k - 1 and only the chunk is computed.
- ``decode``: ``extend`` with e = 1: each position is a one-token step after a cache hit, which
  the runner runs as a decode batch (the graph runner's path).

The full distributions are read through ``LogitsTap``, which wraps the model runner's
``_prompt_logprobs`` step: it receives every logit row the runner computed, with the per-sequence
spans that say which rows belong to which request; each row is mapped to (request, position).
The engine's own prompt logprobs are the same rows (a test checks that they agree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from infer.cli.bench_metrics import quality_metrics

MODES = ("prefill", "extend", "decode")


def pydoc_text() -> str:
    """The documentation strings of ``pydoc_data.topics``, in sorted key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def text_windows(ids: Sequence[int], windows: int, window_len: int) -> list[list[int]]:
    """``windows`` slices of ``window_len`` tokens, evenly spread over ``ids`` (first at 0, last
    ending at the end); they do not overlap when the text is long enough."""
    if windows < 1 or window_len < 2:
        raise ValueError("need at least one window of at least 2 tokens")
    if len(ids) < window_len:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one window of {window_len}")
    span = len(ids) - window_len
    starts = [span * i // max(windows - 1, 1) for i in range(windows)]
    return [list(ids[s:s + window_len]) for s in starts]


def quality_windows(tokenizer: Any, windows: int, window_len: int) -> list[list[int]]:
    return text_windows(tokenizer.encode(pydoc_text(), add_special_tokens=False), windows,
                        window_len)


class LogitsTap:
    """Calls ``sink(rid, first_position, logprobs [n, V])`` for every logit row the runner
    computes. Row j of a sequence's span is position ``num_computed + extend_len - n + j``: the
    runner asks for the last n positions of the chunk it runs (prompt-logprob rows, then the
    sampled rows), and ``num_computed`` is not yet advanced when the rows are handed over."""

    def __init__(self, runner: Any) -> None:
        self.sink: Callable[[str, int, torch.Tensor], None] | None = None
        step_rows = runner._prompt_logprobs

        def tapped(logits: torch.Tensor, batch: Any, spans: Any, res: Any) -> Any:
            if self.sink is not None:
                lp = torch.log_softmax(logits.float(), dim=-1)
                for s, (req, first, n) in zip(batch.seqs, spans, strict=True):
                    if n:
                        self.sink(req.rid, req.num_computed + s.extend_len - n, lp[first:first + n])
            return step_rows(logits, batch, spans, res)

        runner._prompt_logprobs = tapped

    @classmethod
    def on(cls, runner: Any) -> LogitsTap:
        """The runner's tap, installed on first use."""
        tap = getattr(runner, "_logits_tap", None)
        if tap is None:
            tap = runner._logits_tap = cls(runner)
        return tap


@dataclass
class _Scores:
    """Per scored position: negative log-likelihood, KL to the reference, same argmax."""

    nll: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    seen: set[tuple[int, int]] = field(default_factory=set)


def _requests(mode: str, window_len: int, extend_len: int) -> list[tuple[int, int]]:
    """(logprob_start_len, prompt end) of each request one window needs, in order."""
    e = {"prefill": window_len, "extend": extend_len, "decode": 1}[mode]
    return [(lo, min(lo + e, window_len)) for lo in range(0, window_len, e)]


def run_mode(core: Any, windows: list[list[int]], mode: str, extend_len: int,
             on_rows: Callable[[int, int, torch.Tensor], None], tag: str = "q") -> dict[str, int]:
    """Send every window through ``core`` in ``mode``; ``on_rows(window, position, logprobs)``
    gets every computed row. Returns counts: requests, steps, cached prompt tokens."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    if extend_len < 1:
        raise ValueError("extend_len must be at least 1")
    w_len = len(windows[0])
    plan = _requests(mode, w_len, extend_len)
    owner: dict[str, int] = {}
    tap = LogitsTap.on(core.runner)
    tap.sink = lambda rid, p0, lp: on_rows(owner[rid], p0, lp) if rid in owner else None
    counts = {"requests": 0, "steps": 0, "cached_tokens": 0}
    for k, (lo, end) in enumerate(plan):  # request k of every window, all windows at once
        for w, ids in enumerate(windows):
            rid = f"{tag}-{mode}-{w}-{k}"
            owner[rid] = w
            core.add_request(core.make_request(rid, ids[:end], {"max_new_tokens": 0,
                                                                 "temperature": 0.0},
                                               return_logprob=True, logprob_start_len=lo))
            counts["requests"] += 1
        while core.has_work():
            for out in core.step():
                if out.finished:
                    counts["cached_tokens"] += out.cached_tokens
            counts["steps"] += 1
    tap.sink = None
    core.flush_cache()
    return counts


def reference_logprobs(core: Any, windows: list[list[int]]) -> torch.Tensor:
    """float32 log-probabilities [windows, window_len - 1, V] of the scored positions, from
    ``core`` (the reference) in prefill mode."""
    w_len = len(windows[0])
    out = torch.full((len(windows), w_len - 1, core.arch.vocab_size), float("nan"))

    def keep(w: int, p0: int, lp: torch.Tensor) -> None:
        n = max(0, min(lp.shape[0], w_len - 1 - p0))
        out[w, p0:p0 + n] = lp[:n]

    run_mode(core, windows, "prefill", w_len, keep, tag="ref")
    if torch.isnan(out).any():
        raise RuntimeError("the reference left scored positions without logits")
    return out


def score_mode(core: Any, windows: list[list[int]], mode: str, extend_len: int,
               ref: torch.Tensor | None) -> dict[str, Any]:
    """Perplexity (and KL / top-1 agreement against ``ref``) of ``core`` in ``mode``."""
    w_len = len(windows[0])
    targets = torch.tensor([ids[1:] for ids in windows])  # [W, L - 1]
    s = _Scores()

    def score(w: int, p0: int, lp: torch.Tensor) -> None:
        n = max(0, min(lp.shape[0], w_len - 1 - p0))
        if n == 0:
            return
        rows = lp[:n]
        tgt = targets[w, p0:p0 + n]
        s.nll += (-rows.gather(1, tgt[:, None])[:, 0]).tolist()
        for p in range(p0, p0 + n):
            if (w, p) in s.seen:
                raise RuntimeError(f"position {p} of window {w} was scored twice in mode {mode}")
            s.seen.add((w, p))
        if ref is not None:
            r = ref[w, p0:p0 + n]
            s.kl += (r.exp() * (r - rows)).sum(-1).clamp(min=0).tolist()
            s.agree += (r.argmax(-1) == rows.argmax(-1)).tolist()

    counts = run_mode(core, windows, mode, extend_len, score)
    expected = len(windows) * (w_len - 1)
    if len(s.seen) != expected:
        raise RuntimeError(f"mode {mode}: {len(s.seen)} of {expected} positions were scored")
    result = {"mode": mode, "windows": len(windows), "window_len": w_len,
              "extend_len": {"prefill": w_len, "extend": extend_len, "decode": 1}[mode],
              **counts, **quality_metrics(s.nll, s.kl, s.agree)}
    return result


def meets_bar(ppl: float, ref_ppl: float, peer_ppl: float | None = None,
              tolerance: float = 0.01) -> bool:
    """The quality bar of the CPU benchmark: perplexity at most ``tolerance`` above the float32
    reference's, and (when a peer's is given) no higher than the peer's."""
    return ppl <= ref_ppl * (1 + tolerance) and (peer_ppl is None or ppl <= peer_ppl)


def reference_core(server_args: Any) -> Any:
    """The float32 reference of the same weights: the model at ``--dtype float32`` (GGUF blocks
    dequantised, dense float32 matmuls, no quantized kernels), eager."""
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    return EngineCore(ServerArgs(model_path=server_args.model_path, dtype="float32",
                                 disable_cuda_graph=True,
                                 max_total_tokens=server_args.max_total_tokens))


def run_quality(server_args: Any, windows: int, window_len: int, extend_len: int,
                modes: Sequence[str], reference: bool = True) -> list[dict[str, Any]]:
    """Rows: the reference (prefill), then the served path of ``server_args`` in each mode."""
    import gc

    from infer.core.engine.engine_core import EngineCore

    ref = None
    rows: list[dict[str, Any]] = []
    if reference:
        rcore = reference_core(server_args)
        wins = quality_windows(rcore.tokenizer, windows, window_len)
        ref = reference_logprobs(rcore, wins)
        rows.append({"path": "float32 reference", **score_mode(rcore, wins, "prefill",
                                                               extend_len, None)})
        del rcore
        gc.collect()
    core = EngineCore(server_args)
    if ref is None:
        wins = quality_windows(core.tokenizer, windows, window_len)
    for mode in modes:
        rows.append({"path": "infer", **score_mode(core, wins, mode, extend_len, ref)})
    if reference:
        for r in rows[1:]:
            r["ppl_vs_reference"] = r["perplexity"] / rows[0]["perplexity"] - 1
            r["meets_bar"] = meets_bar(r["perplexity"], rows[0]["perplexity"])
    return rows
