"""Wiring: from settings to the parts an EngineCore steps with.

``build_engine(cfg, platform, loaded)`` loads the model when not given one, asks the executor how
many KV pages fit, and builds the pool, the prefix cache, the KV manager, the scheduler, the
grammar backend and the admission desk around it. The settings come in as an ``EngineConfig``
(typed views made once from the ServerArgs at the edge); nothing below reads a ServerArgs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from infer.core.cache.manager import KVManager
from infer.core.cache.page_pool import PagePool
from infer.core.cache.plain_cache import PlainCache
from infer.core.cache.radix_cache import RadixCache
from infer.core.config.views import EngineConfig
from infer.core.engine.admission import Admission, RequestTable
from infer.core.engine.executor import Executor, LocalExecutor
from infer.core.engine.scheduler import Scheduler
from infer.core.sampling.defaults import sampling_defaults

log = logging.getLogger(__name__)


@dataclass
class EngineParts:
    cfg: EngineConfig
    platform: Any
    loaded: Any
    pool: PagePool
    kv: KVManager
    scheduler: Scheduler
    executor: Executor
    grammar: Any
    table: RequestTable
    admission: Admission


def build_grammar(cfg: EngineConfig, loaded: Any, eos_ids: tuple[int, ...]) -> Any:
    name = cfg.grammar_backend
    if name == "none":
        return None
    if name != "xgrammar":
        raise ValueError(f"grammar_backend: {name!r} is not implemented by infer; use xgrammar")
    if loaded.tokenizer is None:
        return None
    from infer.core.sampling.grammar import GrammarBackend

    return GrammarBackend(loaded.tokenizer, loaded.arch.vocab_size, list(eos_ids))


def make_executor(cfg: EngineConfig, platform: Any, loaded: Any = None) -> Executor:
    """One process for one rank; one process per rank (spawned here, or Ray actors) otherwise.
    The executor loads the model (this rank's shard) unless ``loaded`` is given (one rank)."""
    if cfg.parallel.world_size == 1:
        if cfg.parallel.dp_size > 1:  # replicas on one node: each takes its device (or share)
            platform.bind_local_rank(*cfg.parallel.local_slot)
        if loaded is None:
            from infer.core.model.loader import load_model_from_config

            loaded = load_model_from_config(cfg.load, platform=platform)
        return LocalExecutor(cfg, loaded, platform)
    if loaded is not None:
        raise ValueError("a multi-rank engine loads its shards itself; do not pass a loaded model")
    if cfg.parallel.executor_backend == "ray":
        from infer.core.engine.ray_executor import RayExecutor

        return RayExecutor(cfg, platform)
    from infer.core.engine.multiproc import MultiprocExecutor

    return MultiprocExecutor(cfg, platform)


def build_engine(cfg: EngineConfig, platform: Any, loaded: Any = None,
                 executor: Executor | None = None) -> EngineParts:
    if executor is None:
        executor = make_executor(cfg, platform, loaded)
    loaded = executor.loaded
    pool = PagePool(executor.kv_pages(), cfg.cache.page_size)
    cache = PlainCache(pool) if cfg.cache.disable_radix_cache else \
        RadixCache(pool, cfg.cache.radix_eviction_policy)
    kv = KVManager(pool, cache)
    scheduler = Scheduler(cfg.scheduler, kv)
    eos_ids = tuple(loaded.eos_token_ids or ())
    grammar = build_grammar(cfg, loaded, eos_ids)
    executor.start(pool.num_pages, grammar)
    table = RequestTable()
    admission = Admission(
        table, scheduler, arch=loaded.arch, tokenizer=loaded.tokenizer, grammar=grammar,
        eos_ids=eos_ids, pool_tokens=pool.capacity * pool.page_size,
        defaults=sampling_defaults(cfg.sampling_defaults, loaded.generation_config),
        seed=cfg.random_seed)
    log.info("KV pool: %d pages x %d tokens (%d tokens)", pool.capacity, pool.page_size,
             pool.capacity * pool.page_size)
    return EngineParts(cfg=cfg, platform=platform, loaded=loaded, pool=pool, kv=kv,
                       scheduler=scheduler, executor=executor, grammar=grammar, table=table,
                       admission=admission)
