"""Hardware-independent checks across flags, taken from SGLang's server_args.py.

Everything that depends on the device (backends per generation, dtypes per SM) is the support
matrix's business (the gate), never checked here.
"""

from __future__ import annotations

from typing import Any

from infer.core.config.flags import ConfigError

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _fail(message: str) -> None:
    raise ConfigError(message)


def check_piecewise_tokens(max_tokens: Any, explicit: Any) -> list[int] | None:
    """--piecewise-cuda-graph-max-tokens / --piecewise-cuda-graph-tokens: an integer >= 2 and,
    when given, a non-empty list of integers in 2..max (a 1-token extend is a decode row, which
    the decode graphs cover). Returns the sorted distinct explicit buckets, or None."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        _fail(f"--piecewise-cuda-graph-max-tokens {max_tokens!r}: must be an integer >= 2 "
              "(extend graphs cover 2 or more new tokens)")
    if explicit is None:
        return None
    if not isinstance(explicit, list) or not explicit:
        _fail(f"--piecewise-cuda-graph-tokens {explicit!r}: give a non-empty JSON list of token "
              "counts, e.g. [16, 64, 256]")
    for n in explicit:
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= max_tokens:
            _fail(f"--piecewise-cuda-graph-tokens: {n!r} is not an integer in 2..{max_tokens} "
                  "(--piecewise-cuda-graph-max-tokens); raise the max or drop the entry")
    return sorted(set(explicit))


def check_cross_flags(a: Any) -> None:
    """Raise ConfigError naming the flags when settings contradict each other."""
    n = a.spelling
    if a.enable_hierarchical_cache and a.disable_radix_cache:
        _fail(f"{n('enable_hierarchical_cache')} and {n('disable_radix_cache')} are mutually "
              "exclusive: the hierarchical cache extends the radix prefix cache; use only one")
    if not 0 < a.port < 65536:
        _fail(f"{n('port')} {a.port}: a port is between 1 and 65535")
    if a.mem_fraction_static is not None and not 0 < a.mem_fraction_static <= 1:
        _fail(f"{n('mem_fraction_static')} {a.mem_fraction_static}: must be in (0, 1]")
    for dest in ("tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "page_size",
                 "tokenizer_worker_num", "max_loras_per_batch", "stream_interval"):
        value = getattr(a, dest)
        if value is not None and value < 1:
            _fail(f"{n(dest)} {value}: must be at least 1")
    if (a.tp_size * a.pp_size) % a.nnodes:
        _fail(f"{n('tp_size')} x {n('pp_size')} ({a.tp_size * a.pp_size}) must be divisible by "
              f"{n('nnodes')} ({a.nnodes})")
    if a.pp_size > 1 and not (a.disable_overlap_schedule and a.speculative_algorithm is None
                              and not a.enable_mixed_chunk):
        _fail(f"{n('pp_size')} {a.pp_size}: pipeline parallelism needs --disable-overlap-schedule "
              "and is incompatible with --speculative-algorithm and --enable-mixed-chunk")
    if a.dp_size > 1 and a.nnodes != 1 and not a.enable_dp_attention:
        _fail(f"{n('dp_size')} {a.dp_size} over {n('nnodes')} {a.nnodes}: multi-node data "
              "parallelism needs --enable-dp-attention")
    if a.base_gpu_id < 0:
        _fail(f"{n('base_gpu_id')} {a.base_gpu_id}: must be non-negative")
    gc_secs = a.gc_warning_threshold_secs
    if gc_secs is not None and not gc_secs >= 0:  # NaN too
        _fail(f"{n('gc_warning_threshold_secs')} {gc_secs}: must be >= 0 seconds (0 turns it off)")
    if a.gpu_id_step < 1:
        _fail(f"{n('gpu_id_step')} {a.gpu_id_step}: must be at least 1")
    if a.moe_dense_tp_size not in (None, 1):
        _fail(f"{n('moe_dense_tp_size')} {a.moe_dense_tp_size}: only 1 (or unset) is supported")
    if a.enable_piecewise_cuda_graph and a.disable_cuda_graph:
        _fail(f"{n('enable_piecewise_cuda_graph')} captures prefill CUDA graphs, which "
              f"{n('disable_cuda_graph')} turns off; use only one")
    if a.enable_piecewise_cuda_graph:  # at start-up, not after the weights have loaded
        check_piecewise_tokens(a.piecewise_cuda_graph_max_tokens, a.piecewise_cuda_graph_tokens)
    if a.speculative_algorithm is not None and a.enable_mixed_chunk:
        _fail(f"{n('enable_mixed_chunk')} cannot be combined with {n('speculative_algorithm')}")
    if (a.chunked_prefill_size is not None and a.chunked_prefill_size > 0
            and a.chunked_prefill_size % a.page_size):
        _fail(f"{n('chunked_prefill_size')} {a.chunked_prefill_size} must be divisible by "
              f"{n('page_size')} {a.page_size}")
    for dest, levels in (("log_level", LOG_LEVELS), ("log_level_http", (*LOG_LEVELS, "trace"))):
        level = getattr(a, dest)
        if level is not None and str(level).lower() not in levels:
            _fail(f"{n(dest)} {level!r}: not a log level (use one of {', '.join(levels)})")
    if a.enable_dp_lm_head and not a.enable_dp_attention:
        _fail(f"{n('enable_dp_lm_head')} needs --enable-dp-attention")
    if a.enable_dp_attention and a.tp_size % a.dp_size:
        _fail(f"--enable-dp-attention needs {n('tp_size')} ({a.tp_size}) divisible by "
              f"{n('dp_size')} ({a.dp_size})")
    if a.max_loaded_loras is not None and a.max_loaded_loras < a.max_loras_per_batch:
        _fail(f"{n('max_loaded_loras')} {a.max_loaded_loras} must be at least "
              f"{n('max_loras_per_batch')} {a.max_loras_per_batch}")
    if a.lora_target_modules and "all" in a.lora_target_modules and len(a.lora_target_modules) > 1:
        _fail(f"{n('lora_target_modules')}: 'all' must be the only module named")
    if a.disaggregation_mode == "decode" and (a.disaggregation_decode_tp is not None
                                              or a.disaggregation_decode_dp is not None):
        _fail("--disaggregation-decode-tp/--disaggregation-decode-dp are set on the prefill "
              "server, not with --disaggregation-mode decode")
    if a.moe_runner_backend == "flashinfer_cutlass" and a.ep_size not in (1, a.tp_size):
        _fail(f"{n('ep_size')} {a.ep_size}: with --moe-runner-backend flashinfer_cutlass the "
              "expert parallel size must be 1 or equal to --tp-size")
    if (a.speculative_eagle_topk is not None and a.speculative_eagle_topk > 1 and a.page_size > 1
            and a.attention_backend not in (None, "flashinfer")):
        _fail(f"{n('speculative_eagle_topk')} > 1 with {n('page_size')} > 1 is only correct with "
              "--attention-backend flashinfer")
    for dest in ("prompt_tokens_buckets", "generation_tokens_buckets"):
        _check_buckets(n(dest), getattr(a, dest))


def check_parallel_split(tp_size: int, ep_size: int, *, num_heads: int, num_kv_heads: int,
                         intermediate_size: int = 0, num_experts: int = 0,
                         moe_intermediate_size: int = 0) -> None:
    """--tp-size / --ep-size against a model's shapes (read from its config, before any weight
    loads): query heads, KV heads (or replicated: tp a multiple of them), dense and expert
    intermediate sizes, experts. See ``infer.core.model.layers.shard`` for the split."""
    tp, ep = tp_size, ep_size
    if num_heads % tp:
        _fail(f"--tp-size {tp} does not divide the model's {num_heads} attention heads; use a "
              f"tensor-parallel size that divides {num_heads}")
    if (num_kv_heads % tp) if tp <= num_kv_heads else (tp % num_kv_heads):
        _fail(f"--tp-size {tp} and the model's {num_kv_heads} KV heads: the tensor-parallel size "
              f"must divide the KV heads or be a multiple of them")
    if intermediate_size and intermediate_size % tp:
        _fail(f"--tp-size {tp} does not divide the model's intermediate size {intermediate_size}")
    if ep > 1 and not num_experts:
        _fail(f"--ep-size {ep}: the model has no experts (expert parallelism needs a MoE model)")
    if tp % ep:
        _fail(f"--ep-size {ep} must divide --tp-size {tp} (experts are split inside the "
              f"tensor-parallel ranks)")
    if num_experts and num_experts % ep:
        _fail(f"--ep-size {ep} does not divide the model's {num_experts} experts")
    if num_experts and moe_intermediate_size % (tp // ep):
        _fail(f"--tp-size {tp} / --ep-size {ep} splits each expert {tp // ep} ways, which does "
              f"not divide the expert intermediate size {moe_intermediate_size}")


def _check_buckets(name: str, rule: list[str] | None) -> None:
    if not rule:
        return
    kind = rule[0]
    if kind == "default":
        if len(rule) != 1:
            _fail(f"{name}: the 'default' rule takes no values")
    elif kind == "tse":
        try:
            middle, base, count = float(rule[1]), float(rule[2]), int(rule[3])
        except (ValueError, IndexError):
            _fail(f"{name}: the 'tse' rule is: tse <middle> <base> <count>")
        if len(rule) != 4 or base <= 1 or count <= 0 or middle <= 0:
            _fail(f"{name}: 'tse' needs exactly middle > 0, base > 1, count > 0")
    elif kind in ("custom", "customer"):
        try:
            values = [float(x) for x in rule[1:]]
        except ValueError:
            _fail(f"{name}: custom bucket values must be numbers")
        if not values or len(set(values)) != len(values) or min(values) < 0:
            _fail(f"{name}: custom buckets need distinct non-negative values")
    else:
        _fail(f"{name}: unknown rule {kind!r} (choose from default, tse, custom)")
