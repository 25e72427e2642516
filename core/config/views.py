"""Typed views of the settings, built once at the edge from a ``ServerArgs``.

``ServerArgs`` is the whole flag surface (336 flags, their sources and provenance). The engine's
components each need a handful of them, with the engine's own meaning of "unset": these views
carry exactly that, resolved. A default for an unset (``None``) flag is written here and nowhere
else; components and plugin factories receive a view, never the ``ServerArgs``.

    cfg = EngineConfig.from_server_args(args)
    cfg.cache.page_size, cfg.graph.disable, cfg.parallel.tp_size, cfg.scheduler.chunked_prefill_size

Views are frozen dataclasses of plain values: they pickle (ranks of a multi-process executor
receive them) and compare by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_RUNNING_REQUESTS = 256
DEFAULT_MEM_FRACTION = 0.8
DEFAULT_POOL_CONTEXTS = 4  # with no memory flag set, the pool holds this many full contexts


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


@dataclass
class SchedulerConfig:
    """What the scheduler reads (see infer.core.engine.scheduler)."""

    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    max_queued_requests: int | None = None
    chunked_prefill_size: int | None = 8192  # None or <= 0: whole prompts in one step
    max_prefill_tokens: int = 16384
    prefill_max_requests: int | None = None
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = 10
    enable_mixed_chunk: bool = False
    random_seed: int = 0
    decode_tokens: int = 1  # KV slots a decode row reserves per step (1 + draft tokens with speculation)

    @classmethod
    def from_server_args(cls, args: Any) -> SchedulerConfig:
        def get(name: str, default: Any) -> Any:
            return _or(getattr(args, name), default)

        return cls(
            max_running_requests=get("max_running_requests", DEFAULT_MAX_RUNNING_REQUESTS),
            max_queued_requests=args.max_queued_requests,
            chunked_prefill_size=get("chunked_prefill_size", 8192),
            max_prefill_tokens=get("max_prefill_tokens", 16384),
            prefill_max_requests=args.prefill_max_requests,
            schedule_policy=get("schedule_policy", "fcfs"),
            schedule_conservativeness=get("schedule_conservativeness", 1.0),
            enable_priority_scheduling=get("enable_priority_scheduling", False),
            schedule_low_priority_values_first=get("schedule_low_priority_values_first", False),
            priority_scheduling_preemption_threshold=get(
                "priority_scheduling_preemption_threshold", 10),
            enable_mixed_chunk=get("enable_mixed_chunk", False),
            random_seed=get("random_seed", 0),
        )



@dataclass(frozen=True)
class LoadConfig:
    """What the loader needs: the checkpoint, its precision, the implementations to build it with.
    Field names and meanings are ``load_model``'s keyword arguments."""

    model_path: str
    dtype: str = "auto"
    dtype_explicit: bool = False  # --dtype was set (by the user, env or config) to a non-auto value
    load_format: str = "auto"
    revision: str | None = None
    quantization: str | None = None
    tokenizer_path: str | None = None
    context_length: int | None = None
    model_impl: str = "auto"
    trust_remote_code: bool = False
    attention_backend: str | None = None  # None: the platform's default
    moe_runner_backend: str = "auto"
    page_size: int = 1
    max_batch_size: int = DEFAULT_MAX_RUNNING_REQUESTS
    skip_tokenizer_init: bool = False
    torchao_config: str = ""
    kv_cache_dtype: str = "auto"
    quantization_param_path: str | None = None
    enable_deterministic_inference: bool = False

    @classmethod
    def from_server_args(cls, args: Any) -> LoadConfig:
        explicit = "dtype" in (getattr(args, "model_fields_set", None) or ()) and args.dtype != "auto"
        return cls(
            model_path=args.model_path, dtype=args.dtype, dtype_explicit=explicit,
            load_format=args.load_format, revision=args.revision, quantization=args.quantization,
            tokenizer_path=args.tokenizer_path, context_length=args.context_length,
            model_impl=args.model_impl, trust_remote_code=args.trust_remote_code,
            attention_backend=args.attention_backend,
            moe_runner_backend=_or(args.moe_runner_backend, "auto"),
            page_size=_or(args.page_size, 1),
            max_batch_size=_or(args.max_running_requests, DEFAULT_MAX_RUNNING_REQUESTS),
            skip_tokenizer_init=args.skip_tokenizer_init, torchao_config=args.torchao_config or "",
            kv_cache_dtype=_or(args.kv_cache_dtype, "auto"),
            quantization_param_path=args.quantization_param_path,
            enable_deterministic_inference=bool(args.enable_deterministic_inference))

    def load_kwargs(self) -> dict[str, Any]:
        """``load_model`` keyword arguments (everything but ``model_path``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "model_path"}


@dataclass(frozen=True)
class CacheConfig:
    """The KV pool and the prefix cache."""

    page_size: int = 1
    max_total_tokens: int | None = None  # fixes the pool size; else sized from device memory
    mem_fraction_static: float | None = None  # None: DEFAULT_MEM_FRACTION, pool capped below
    disable_radix_cache: bool = False
    radix_eviction_policy: str = "lru"

    @property
    def mem_fraction(self) -> float:
        return _or(self.mem_fraction_static, DEFAULT_MEM_FRACTION)

    @classmethod
    def from_server_args(cls, args: Any) -> CacheConfig:
        return cls(page_size=int(_or(args.page_size, 1)), max_total_tokens=args.max_total_tokens,
                   mem_fraction_static=args.mem_fraction_static,
                   disable_radix_cache=bool(args.disable_radix_cache),
                   radix_eviction_policy=_or(args.radix_eviction_policy, "lru"))


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is split over ranks and replicas (tp x pp ranks per replica, dp replicas)."""

    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    load_balance_method: str = "round_robin"
    executor_backend: str = "mp"  # --distributed-executor-backend: mp (spawned processes) or ray
    dp_rank: int = 0  # which data-parallel replica this engine is (set by the server per replica)

    @property
    def local_slot(self) -> tuple[int, int]:
        """(first device slot of this replica on its node, slots used on the node by all replicas)."""
        per_node = self.world_size // self.nnodes
        return self.dp_rank * per_node, self.dp_size * per_node

    @property
    def world_size(self) -> int:
        """Ranks of one replica."""
        return self.tp_size * self.pp_size

    @classmethod
    def from_server_args(cls, args: Any) -> ParallelConfig:
        lb = _or(args.load_balance_method, "auto")
        tp = int(_or(args.tp_size, 1))
        ep = tp if args.enable_expert_parallel else int(_or(args.ep_size, 1))
        return cls(tp_size=tp, pp_size=int(_or(args.pp_size, 1)),
                   dp_size=int(_or(args.dp_size, 1)), ep_size=ep,
                   nnodes=int(_or(args.nnodes, 1)), node_rank=int(_or(args.node_rank, 0)),
                   dist_init_addr=args.dist_init_addr, dist_timeout=args.dist_timeout,
                   load_balance_method="round_robin" if lb == "auto" else lb,
                   executor_backend=args.distributed_executor_backend)


@dataclass(frozen=True)
class GraphConfig:
    """Decode (and extend) graph capture: CUDA graphs, ACL graphs, the CPU's native decode stack.
    ``None`` sizes mean "the graph runner's own default" (each runner documents it)."""

    disable: bool = False
    batch_sizes: list[int] | None = None  # --cuda-graph-bs
    max_bs: int | None = None  # --cuda-graph-max-bs
    max_running_requests: int | None = None
    disable_padding: bool = False
    enable_piecewise: bool = False
    piecewise_max_tokens: int | None = None
    piecewise_tokens: list[int] | None = None  # --piecewise-cuda-graph-tokens, as given
    chunked_prefill_size: int | None = None
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32

    @classmethod
    def from_server_args(cls, args: Any) -> GraphConfig:
        return cls(disable=bool(args.disable_cuda_graph),
                   batch_sizes=args.cuda_graph_bs, max_bs=args.cuda_graph_max_bs,
                   max_running_requests=args.max_running_requests,
                   disable_padding=bool(args.disable_cuda_graph_padding),
                   enable_piecewise=bool(args.enable_piecewise_cuda_graph),
                   piecewise_max_tokens=args.piecewise_cuda_graph_max_tokens,
                   piecewise_tokens=args.piecewise_cuda_graph_tokens,
                   chunked_prefill_size=args.chunked_prefill_size,
                   enable_torch_compile=bool(args.enable_torch_compile),
                   torch_compile_max_bs=int(_or(args.torch_compile_max_bs, 32)))


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (not implemented yet: the matrix refuses its flags; the view exists so
    that the step and KV contracts it needs are typed from the start)."""

    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    draft_model_path: str | None = None

    @property
    def enabled(self) -> bool:
        return self.algorithm is not None

    @property
    def tokens_per_step(self) -> int:
        """Most tokens one request may gain in one step (1 without speculation)."""
        return 1 + (self.num_draft_tokens or 0) if self.enabled else 1

    @classmethod
    def from_server_args(cls, args: Any) -> SpeculativeConfig:
        return cls(algorithm=args.speculative_algorithm, num_steps=args.speculative_num_steps,
                   eagle_topk=args.speculative_eagle_topk,
                   num_draft_tokens=args.speculative_num_draft_tokens,
                   draft_model_path=args.speculative_draft_model_path)


@dataclass(frozen=True)
class EngineConfig:
    """Everything EngineCore and its parts read, as views."""

    load: LoadConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    overlap_schedule: bool = True
    sampling_defaults: str = "model"
    random_seed: int | None = None
    grammar_backend: str = "xgrammar"
    deterministic: bool = False
    gc_warning_threshold_secs: float = 0.0  # 0: off (engine and ranks; gc_watch)

    @classmethod
    def from_server_args(cls, args: Any) -> EngineConfig:
        return cls(load=LoadConfig.from_server_args(args),
                   cache=CacheConfig.from_server_args(args),
                   parallel=ParallelConfig.from_server_args(args),
                   graph=GraphConfig.from_server_args(args),
                   speculative=SpeculativeConfig.from_server_args(args),
                   scheduler=SchedulerConfig.from_server_args(args),
                   overlap_schedule=not args.disable_overlap_schedule,
                   sampling_defaults=_or(args.sampling_defaults, "model"),
                   random_seed=args.random_seed,
                   grammar_backend=_or(args.grammar_backend, "xgrammar"),
                   deterministic=bool(args.enable_deterministic_inference),
                   gc_warning_threshold_secs=float(args.gc_warning_threshold_secs or 0.0))
