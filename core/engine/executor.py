"""Executor: what stands between the engine's stepping core and the model runner(s).

The engine schedules on one process; an executor owns the model runner(s) that carry a step out.
It answers three things:

- ``kv_pages()``: how many KV pages the pool may hold, sized from the device memory left after the
  weights (the smallest over every rank it drives), or from ``--max-total-tokens``.
- ``launch(batch, defer) -> LaunchedStep`` and ``resolve(step) -> StepResult``: queue one
  scheduled batch on the device(s) and later wait for its sampled tokens (see ModelRunner for
  ``defer``, the overlap-scheduling hand-off).
- ``forget(rid)``: a request ended; drop whatever per-request state the runners keep.

``LocalExecutor`` runs one model runner in this process (one device). A multi-rank executor runs
one runner per rank, each with its shard of the model, on the same batch.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from infer.core.cache.page_pool import kv_bytes_per_token
from infer.core.config.views import DEFAULT_POOL_CONTEXTS, CacheConfig, EngineConfig
from infer.core.engine.model_runner import LaunchedStep, ModelRunner, StepResult, kv_layers
from infer.core.engine.scheduler import ScheduleBatch

log = logging.getLogger(__name__)


def pool_pages(cache: CacheConfig, loaded: Any, memory_available: int) -> int:
    """KV pages (including the scratch page 0) for one rank holding ``loaded`` (its shard of the
    weights, its KV heads in each layer whose cache it keeps), with ``memory_available`` bytes
    on its device."""
    ps = cache.page_size
    if cache.max_total_tokens:
        return -(-int(cache.max_total_tokens) // ps) + 1
    arch = loaded.arch
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    kv_heads = loaded.ctx.attn_backend.config.num_kv_heads
    per_token = kv_bytes_per_token(len(kv_layers(loaded)), kv_heads, arch.head_dim,
                                   arch.kv_dtype.itemsize)
    frac = cache.mem_fraction
    budget = int(frac * memory_available) - weight_bytes
    tokens = budget // per_token
    if cache.mem_fraction_static is None:
        tokens = min(tokens, DEFAULT_POOL_CONTEXTS * arch.context_length)
    if tokens < ps * 2:
        raise ValueError(
            f"mem_fraction_static: {frac} of {memory_available} bytes leaves no room for the KV "
            f"cache after {weight_bytes} bytes of weights; raise --mem-fraction-static or set "
            f"--max-total-tokens")
    return tokens // ps + 1


class Executor(ABC):
    """Carries out scheduled batches on the model runner(s) it owns. ``loaded``: the model (this
    process's shard of it) that the engine takes its tokenizer and shapes from."""

    loaded: Any

    @abstractmethod
    def kv_pages(self) -> int: ...

    @abstractmethod
    def start(self, num_pages: int, grammar: Any) -> None:
        """Allocate the KV caches (``num_pages`` pages per rank) and build the runner(s)."""

    @abstractmethod
    def launch(self, batch: ScheduleBatch, defer: bool) -> LaunchedStep: ...

    @abstractmethod
    def resolve(self, step: LaunchedStep) -> StepResult: ...

    @abstractmethod
    def forget(self, rid: str) -> None: ...

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the runners (and their processes); the executor is unusable afterwards."""


class LocalExecutor(Executor):
    """One model runner in this process, on the platform's device."""

    def __init__(self, cfg: EngineConfig, loaded: Any, platform: Any) -> None:
        self.cfg = cfg
        self.loaded = loaded
        self.platform = platform
        self.runner: ModelRunner | None = None

    def kv_pages(self) -> int:
        return pool_pages(self.cfg.cache, self.loaded, self.platform.memory_available())

    def start(self, num_pages: int, grammar: Any) -> None:
        self.runner = ModelRunner(self.loaded, self.cfg, num_pages, self.platform, grammar)

    def launch(self, batch: ScheduleBatch, defer: bool) -> LaunchedStep:
        return self.runner.launch(batch, defer)

    def resolve(self, step: LaunchedStep) -> StepResult:
        return self.runner.resolve(step)

    def forget(self, rid: str) -> None:
        self.runner.forget(rid)

    def shutdown(self) -> None:
        self.runner = None  # its caches and graphs go with it
