"""Vectorised sampling over a batch: one [B, V] pass, no per-row host round trips.

Order of operations on the logits of each row (float32):
  1. repetition penalty (prompt + output tokens), frequency / presence penalties (output tokens)
  2. min_new_tokens: stop tokens masked while the row has produced fewer tokens
  3. grammar bitmask (rows with a grammar)
  4. logprobs (log_softmax of the result of 1-3) when any row asks for them
  5. greedy rows: argmax; others: temperature, top_k, top_p, min_p, then an exponential race
     whose noise is a pure function of (seed, output position, token id), so a row's draw does
     not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M30, _M27, _M31, _M40 = (1 << 34) - 1, (1 << 37) - 1, (1 << 33) - 1, (1 << 24) - 1
_C1, _C2 = -4658895280553007687, -7723592293110705685  # splitmix64 multipliers as int64
_GOLD, _STEP = -7046029254386353131, 0x2545F4914F6CDD1D


@dataclass
class SamplingTensors:
    """Per-row sampling inputs, built by the model runner. All [B] unless stated."""

    temperature: torch.Tensor  # float32; rows with greedy=True ignore it
    top_p: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, V when disabled
    min_p: torch.Tensor  # float32
    greedy: torch.Tensor  # bool
    seed: torch.Tensor  # int64
    step: torch.Tensor  # int64, output tokens so far (position of the draw)
    all_greedy: bool
    need_top_filter: bool  # any row with top_k < V, top_p < 1 or min_p > 0
    repetition_penalty: torch.Tensor | None = None  # float32, None when all 1
    seen_mask: torch.Tensor | None = None  # [B, V] bool, prompt + output tokens
    frequency_penalty: torch.Tensor | None = None  # float32, None when all penalties are 0
    presence_penalty: torch.Tensor | None = None
    output_counts: torch.Tensor | None = None  # [B, V] float32 output token counts
    stop_mask: torch.Tensor | None = None  # [B, V] bool: tokens to forbid this step
    grammar_bitmask: torch.Tensor | None = None  # [B, ceil(V/32)] int32 (xgrammar layout)
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass
class SampleOutput:
    ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B] float32 logprob of the chosen token
    top_ids: torch.Tensor | None = None  # [B, K] int64
    top_logprobs: torch.Tensor | None = None  # [B, K] float32


def _lshr(x: torch.Tensor, n: int, mask: int) -> torch.Tensor:
    return (x >> n) & mask


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] float32 in (0, 1): splitmix64 of (seed, step, token id)."""
    tok = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    x = (seed * _GOLD + step * _STEP)[:, None] + tok[None, :] * _GOLD
    x = x ^ _lshr(x, 30, _M30)
    x = x * _C1
    x = x ^ _lshr(x, 27, _M27)
    x = x * _C2
    x = x ^ _lshr(x, 31, _M31)
    return (_lshr(x, 40, _M40).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def apply_penalties(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    if t.repetition_penalty is not None and t.seen_mask is not None:
        p = t.repetition_penalty[:, None]
        penalised = torch.where(logits > 0, logits / p, logits * p)
        logits = torch.where(t.seen_mask, penalised, logits)
    if t.output_counts is not None:
        if t.frequency_penalty is not None:
            logits = logits - t.frequency_penalty[:, None] * t.output_counts
        if t.presence_penalty is not None:
            logits = logits - t.presence_penalty[:, None] * (t.output_counts > 0).to(logits.dtype)
    if t.stop_mask is not None:
        logits = logits.masked_fill(t.stop_mask, float("-inf"))
    return logits


def sample(logits: torch.Tensor, t: SamplingTensors) -> SampleOutput:
    """``logits`` [B, V] -> one token per row (see the module docstring for the order)."""
    logits = apply_penalties(logits.float(), t)
    if t.grammar_bitmask is not None:
        from infer.core.sampling.grammar import apply_bitmask
        apply_bitmask(logits, t.grammar_bitmask)
    out = SampleOutput(ids=logits.argmax(dim=-1))
    if not t.all_greedy:
        probs = torch.softmax(logits / t.temperature.clamp_min(1e-5)[:, None], dim=-1)
        if t.need_top_filter:
            probs = _top_filter(probs, t)
        race = probs / -torch.log(uniform_noise(t.seed, t.step, logits.shape[-1]))
        out.ids = torch.where(t.greedy, out.ids, race.argmax(dim=-1))
    if t.logprobs:
        lp = torch.log_softmax(logits, dim=-1)
        out.logprobs = lp.gather(1, out.ids[:, None])[:, 0]
        if t.top_logprobs > 0:
            out.top_logprobs, out.top_ids = lp.topk(t.top_logprobs, dim=-1)
    return out


def _top_filter(probs: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Zero the probabilities outside top_k, outside the top_p nucleus and below min_p * max."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    drop = rank >= t.top_k[:, None]
    cum = sorted_p.cumsum(dim=-1)
    drop |= (cum - sorted_p) > t.top_p[:, None]  # keep the smallest prefix reaching top_p
    drop |= sorted_p < (t.min_p[:, None] * sorted_p[:, :1])
    drop[:, 0] = False
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, idx, sorted_p)


def prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor, top_n: int
                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """logits [T, V] of positions 0..T-1, targets [T] the next tokens -> logprobs [T] (and
    top-n values/ids [T, n] when top_n > 0)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, targets[:, None])[:, 0]
    if top_n > 0:
        vals, ids = lp.topk(top_n, dim=-1)
        return chosen, vals, ids
    return chosen, None, None
