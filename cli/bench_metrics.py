"""Arithmetic of ``infer bench``: percentiles, throughputs and latency summaries.

Everything here is pure (no clocks, no I/O) so the tests can check it exactly. Times are seconds;
summaries report milliseconds like SGLang's bench_serving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class Summary:
    """mean / median / p99 (and min / max) of one latency, in milliseconds."""

    mean_ms: float
    median_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Summary:
        ms = [s * 1000 for s in seconds]
        return cls(mean_ms=mean(ms), median_ms=percentile(ms, 50), p99_ms=percentile(ms, 99),
                   min_ms=min(ms) if ms else math.nan, max_ms=max(ms) if ms else math.nan)


def inter_token_latencies(token_times: Sequence[float]) -> list[float]:
    """Gaps between consecutive output chunks; ``token_times`` are the arrival times of the
    first and every later chunk of one request (so the first gap is not the TTFT)."""
    return [b - a for a, b in zip(token_times, token_times[1:], strict=False)]


@dataclass
class RequestRecord:
    """What the client observed for one request (times from the same monotonic clock)."""

    start: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    end: float = math.nan
    input_tokens: int = 0
    output_tokens: int = 0
    ok: bool = False
    error: str = ""

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start if self.chunk_times else math.nan

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; NaN with fewer than two tokens."""
        if self.output_tokens < 2 or not self.chunk_times:
            return math.nan
        return (self.end - self.chunk_times[0]) / (self.output_tokens - 1)


def serving_metrics(records: Sequence[RequestRecord], duration: float) -> dict[str, Any]:
    """The bench_serving summary of one run of ``duration`` seconds."""
    if duration <= 0:
        raise ValueError("duration must be positive")
    ok = [r for r in records if r.ok]
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    itl = [g for r in ok for g in inter_token_latencies(r.chunk_times)]
    tpot = [r.tpot for r in ok if not math.isnan(r.tpot)]
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "concurrency": sum(r.e2e for r in ok) / duration,
        "ttft": asdict(Summary.of([r.ttft for r in ok])),
        "tpot": asdict(Summary.of(tpot)),
        "itl": asdict(Summary.of(itl)),
        "e2e": asdict(Summary.of([r.e2e for r in ok])),
        "errors": sorted({r.error for r in records if not r.ok and r.error})[:5],
    }


def one_batch_metrics(batch_size: int, input_len: int, output_len: int, prefill_s: float,
                      decode_step_s: Sequence[float]) -> dict[str, Any]:
    """bench_one_batch numbers: the prefill makes the first token of every row, each decode step
    one more token per row (``output_len - 1`` steps)."""
    decode_s = sum(decode_step_s)
    decode_tokens = batch_size * len(decode_step_s)
    return {
        "batch_size": batch_size,
        "input_len": input_len,
        "output_len": output_len,
        "prefill_latency_s": prefill_s,
        "prefill_throughput": batch_size * input_len / prefill_s if prefill_s > 0 else math.nan,
        "decode_latency_median_s": percentile(decode_step_s, 50),
        "decode_throughput": decode_tokens / decode_s if decode_s > 0 else math.nan,
        "total_latency_s": prefill_s + decode_s,
        "overall_throughput": (batch_size * (input_len + output_len) / (prefill_s + decode_s)
                               if prefill_s + decode_s > 0 else math.nan),
    }


def offline_metrics(num_requests: int, input_tokens: int, output_tokens: int,
                    duration: float) -> dict[str, Any]:
    if duration <= 0:
        raise ValueError("duration must be positive")
    return {
        "num_requests": num_requests,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "duration_s": duration,
        "request_throughput": num_requests / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }


def quality_metrics(nll: Sequence[float], kl: Sequence[float] = (),
                    agree: Sequence[bool] = ()) -> dict[str, Any]:
    """Perplexity exp(mean nll) over the scored tokens; with a reference, the mean and 99th
    percentile of KL(reference || path) per token (nats) and the share of tokens whose argmax
    agrees with the reference's."""
    if not nll:
        raise ValueError("no scored tokens")
    out: dict[str, Any] = {"tokens": len(nll), "mean_nll": mean(nll),
                           "perplexity": math.exp(mean(nll))}
    if kl:
        out.update(kl_mean=mean(kl), kl_p99=percentile(kl, 99), top1_agree=mean([float(a) for a in agree]))
    return out
