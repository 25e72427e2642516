"""Prometheus metrics (``--enable-metrics``), served at ``GET /metrics``.

Counters and histograms are updated by the HTTP process as requests finish and tokens stream;
the gauges (queue, running, KV usage, prefix-cache hit rate) are read from the engine's latest
stats at scrape time. Buckets come from ``--bucket-time-to-first-token``,
``--bucket-inter-token-latency`` and ``--bucket-e2e-request-latency``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
_ITL = [0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5]
_E2E = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320]

# gauge name -> (EngineStats fields to read, first present wins; help text)
_GAUGES = {
    "num_queue_reqs": (("queued",), "Requests waiting in the queue"),
    "num_running_reqs": (("running",), "Requests running"),
    "token_usage": (("token_usage",), "Fraction of KV-cache pages held by running requests"),
    "cache_hit_rate": (("prefix_cache_hit_rate",), "Prefix-cache hit rate (cached / prompt tokens)"),
}


class Metrics:
    def __init__(self, model_name: str, args: Any) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.labels = {"model_name": model_name}
        r = self.registry

        def buckets(name: str, default: list[float]) -> list[float]:
            given = getattr(args, name, None)
            return sorted(float(b) for b in given) if given else default

        self.requests = Counter("infer:num_requests", "Finished requests", labels + ["finish_reason"],
                                registry=r)
        self.prompt_tokens = Counter("infer:prompt_tokens", "Prompt tokens processed", labels,
                                     registry=r)
        self.generation_tokens = Counter("infer:generation_tokens", "Tokens generated", labels,
                                         registry=r)
        self.cached_tokens = Counter("infer:cached_tokens", "Prompt tokens served from the prefix cache",
                                     labels, registry=r)
        self.ttft = Histogram("infer:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=buckets("bucket_time_to_first_token", _TTFT), registry=r)
        self.itl = Histogram("infer:inter_token_latency_seconds", "Time between output tokens", labels,
                             buckets=buckets("bucket_inter_token_latency", _ITL), registry=r)
        self.e2e = Histogram("infer:e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=buckets("bucket_e2e_request_latency", _E2E), registry=r)
        self.gauges = {name: Gauge(f"infer:{name}", doc, labels, registry=r)
                       for name, (_, doc) in _GAUGES.items()}
        self.replica_gauges: dict[str, Gauge] | None = None  # made when replicas first report

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.labels(**self.labels).observe(seconds)

    def observe_tokens(self, seconds: float, num_tokens: int) -> None:
        """``num_tokens`` tokens arrived together ``seconds`` after the previous ones."""
        if num_tokens > 0:
            per = seconds / num_tokens
            for _ in range(num_tokens):
                self.itl.labels(**self.labels).observe(per)

    def observe_finished(self, finish_reason: str, prompt: int, completion: int, cached: int,
                         seconds: float) -> None:
        self.requests.labels(finish_reason=finish_reason, **self.labels).inc()
        self.prompt_tokens.labels(**self.labels).inc(prompt)
        self.generation_tokens.labels(**self.labels).inc(completion)
        self.cached_tokens.labels(**self.labels).inc(cached)
        self.e2e.labels(**self.labels).observe(seconds)

    def render(self, engine_stats: dict[str, Any]) -> bytes:
        """The gauges from the engine's stats; with data-parallel replicas (``replicas`` in the
        stats) the same gauges per replica too, labelled ``dp_rank``."""
        self._set(self.gauges, engine_stats, self.labels)
        for rep in engine_stats.get("replicas", ()):
            if self.replica_gauges is None:
                self.replica_gauges = {
                    name: Gauge(f"infer:replica_{name}", f"{doc}, per data-parallel replica",
                                ["model_name", "dp_rank"], registry=self.registry)
                    for name, (_, doc) in _GAUGES.items()}
            self._set(self.replica_gauges, rep, {**self.labels, "dp_rank": str(rep["dp_rank"])})
        return generate_latest(self.registry)

    @staticmethod
    def _set(gauges: dict[str, Gauge], stats: dict[str, Any], labels: dict[str, str]) -> None:
        for name, (keys, _) in _GAUGES.items():
            value = next((stats[k] for k in keys if k in stats), None)
            if isinstance(value, (int, float)):
                gauges[name].labels(**labels).set(value)
