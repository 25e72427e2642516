"""The server-flag table as typed specs, plus the name lookups (SGLang names, aliases, vLLM spellings).

``FLAG_SPECS`` maps an SGLang dest name (the ServerArgs field) to its ``FlagSpec``;
``lookup_name("--max-model-len")`` resolves any spelling a user may type to ``(spec, constant)``
where ``constant`` is the value a value-less alias implies (``--enforce-eager`` means
``disable_cuda_graph=True``), or ``NO_CONSTANT``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any


def load_flag_table() -> list[dict[str, Any]]:
    """The server-flag table shipped as package data (``flags.json``, written by
    ``docs/tools/gen_flags.py`` from the SGLang seed pages): one record per flag, in section order."""
    text = resources.files(__package__).joinpath("flags.json").read_text(encoding="utf-8")
    return json.loads(text)


# Flags of infer's own (vLLM's spellings of settings SGLang has no flag for), in the same form.
INFER_FLAGS: list[dict[str, Any]] = [
    {"section": "Multi-node distributed serving", "flag": "--distributed-executor-backend",
     "aliases": [], "dest": "distributed_executor_backend", "type": "str", "choices": ["mp", "ray"],
     "nargs": None, "action": None, "default": "mp",
     "help": "How the ranks of a multi-rank engine are started: mp (one spawned process per rank "
             "on each node) or ray (Ray actors placed by a placement group on the running Ray "
             "cluster, or a local one). vLLM's flag."},
    {"section": "MoE", "flag": "--enable-expert-parallel", "aliases": [],
     "dest": "enable_expert_parallel", "type": "bool", "choices": None, "nargs": None,
     "action": "store_true", "default": False,
     "help": "Split the experts of MoE layers across the tensor-parallel ranks (expert "
             "parallelism of size --tp-size), instead of sharding every expert. vLLM's flag."},
]

FLAGS: list[dict[str, Any]] = load_flag_table() + INFER_FLAGS


class ConfigError(ValueError):
    """A setting is unknown, badly typed, out of its choices or contradicts another one.

    The message names the flag(s) as typed on the command line and says what to do.
    """


@dataclass(frozen=True)
class FlagSpec:
    section: str
    flag: str  # the SGLang flag name, e.g. "--page-size"
    dest: str  # the ServerArgs field, e.g. "page_size"
    type: str  # str | int | float | bool | json | list[str] | list[int] | list[float]
    default: Any
    help: str
    aliases: tuple[str, ...] = ()
    choices: tuple[Any, ...] | None = None
    deprecated: dict[str, Any] | None = None  # {"set": {dest: value | "@value" | "@<dest>"}}

    @property
    def is_bool(self) -> bool:
        return self.type == "bool"

    @property
    def is_list(self) -> bool:
        return self.type.startswith("list[")

    @property
    def item_type(self) -> str:
        return self.type[5:-1] if self.is_list else self.type

    @property
    def names(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


def _spec(row: dict[str, Any]) -> FlagSpec:
    return FlagSpec(section=row["section"], flag=row["flag"], dest=row["dest"], type=row["type"],
                    default=row["default"], help=row["help"], aliases=tuple(row["aliases"]),
                    choices=None if row["choices"] is None else tuple(row["choices"]),
                    deprecated=row.get("deprecated"))


FLAG_SPECS: dict[str, FlagSpec] = {row["dest"]: _spec(row) for row in FLAGS}
SECTIONS: list[str] = list(dict.fromkeys(s.section for s in FLAG_SPECS.values()))

NO_CONSTANT = object()


@dataclass(frozen=True)
class VllmAlias:
    """A ``vllm serve`` spelling mapped onto the SGLang setting with the same meaning."""

    name: str
    dest: str
    constant: Any = NO_CONSTANT  # value-less switch: the value it sets
    help: str = ""
    values: dict[str, Any] = field(default_factory=dict)  # vLLM value spellings -> ours

    @property
    def is_switch(self) -> bool:
        return self.constant is not NO_CONSTANT


# Only spellings that differ from SGLang's; --model, --tensor-parallel-size, --served-model-name,
# --quantization, --kv-cache-dtype, --api-key, --chat-template, ... are SGLang names already.
VLLM_ALIASES: dict[str, VllmAlias] = {a.name: a for a in [
    VllmAlias("--max-model-len", "context_length", help="vLLM spelling of --context-length."),
    VllmAlias("--gpu-memory-utilization", "mem_fraction_static",
              help="vLLM spelling of --mem-fraction-static."),
    VllmAlias("--max-num-seqs", "max_running_requests",
              help="vLLM spelling of --max-running-requests."),
    VllmAlias("--max-num-batched-tokens", "chunked_prefill_size",
              help="vLLM spelling of --chunked-prefill-size (tokens per prefill chunk)."),
    VllmAlias("--enforce-eager", "disable_cuda_graph", True,
              help="vLLM spelling of --disable-cuda-graph (no device graphs, eager mode)."),
    VllmAlias("--seed", "random_seed", help="vLLM spelling of --random-seed."),
    VllmAlias("--block-size", "page_size", help="vLLM spelling of --page-size (tokens per KV page)."),
    VllmAlias("--enable-prefix-caching", "disable_radix_cache", False,
              help="vLLM spelling: keep the radix prefix cache on (the default)."),
    VllmAlias("--no-enable-prefix-caching", "disable_radix_cache", True,
              help="vLLM spelling of --disable-radix-cache."),
    VllmAlias("--uvicorn-log-level", "log_level_http", help="vLLM spelling of --log-level-http."),
    VllmAlias("--tokenizer", "tokenizer_path", help="vLLM spelling of --tokenizer-path."),
]}

# KV-cache dtype spellings vLLM accepts that name one of ours.
VALUE_ALIASES: dict[str, dict[str, Any]] = {
    "kv_cache_dtype": {"fp8": "fp8_e4m3"},
    # SGLang's earlier name of the fewest-requests-in-flight balancer
    "load_balance_method": {"shortest_queue": "total_requests"},
}

# vLLM flags with no meaning in infer: accepted by name so the user gets this reason, never ignored.
VLLM_REJECTED: dict[str, str] = {
    "--swap-space": "infer has no CPU swap space for preempted requests (they are recomputed); "
                    "remove --swap-space, or use --enable-hierarchical-cache for a host KV tier",
}

# Choice flags whose values plugins extend through register_* hooks: ServerArgs accepts any value,
# and the gate checks it against the seed's choices plus the registry (table name) of the platform.
OPEN_CHOICES: dict[str, str] = {
    "attention_backend": "attention",
    "prefill_attention_backend": "attention",
    "decode_attention_backend": "attention",
    "speculative_draft_attention_backend": "attention",
    "quantization": "linear",
    "speculative_draft_model_quantization": "linear",
    "moe_runner_backend": "moe",
    "speculative_moe_runner_backend": "moe",
}

_BY_NAME: dict[str, FlagSpec] = {}
for _s in FLAG_SPECS.values():
    for _n in _s.names:
        _BY_NAME[_n] = _s


def lookup_name(name: str) -> tuple[FlagSpec, Any]:
    """Resolve a flag spelling (``--x``, ``x``, ``x_y``) to (spec, constant). Raises ConfigError."""
    key = name if name.startswith("--") else "--" + name.replace("_", "-")
    if key in _BY_NAME:
        return _BY_NAME[key], NO_CONSTANT
    if key in VLLM_ALIASES:
        alias = VLLM_ALIASES[key]
        return FLAG_SPECS[alias.dest], alias.constant
    bare = name.lstrip("-")
    if bare in FLAG_SPECS:
        return FLAG_SPECS[bare], NO_CONSTANT
    if key in VLLM_REJECTED:
        raise ConfigError(f"{key}: {VLLM_REJECTED[key]}")
    raise ConfigError(f"unknown setting {name!r}: see `infer serve --help` for the flags")


def translate_value(spec: FlagSpec, value: Any) -> Any:
    """Map a vLLM value spelling onto ours (``--kv-cache-dtype fp8`` -> ``fp8_e4m3``)."""
    table = VALUE_ALIASES.get(spec.dest)
    if table and isinstance(value, str) and value in table:
        return table[value]
    return value
