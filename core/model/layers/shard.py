"""How a rank's shard of the model is chosen (tensor and expert parallelism).

A replica runs on ``tp`` ranks; rank ``r`` (0-based) holds these slices of each checkpoint tensor
and nothing else (the loader reads only them, see ``infer.core.model.loader.weights``):

- Query heads: ``H % tp == 0``; rank r holds heads ``[r*H/tp, (r+1)*H/tp)``, i.e. rows
  ``[r*H/tp*D, (r+1)*H/tp*D)`` of ``q_proj`` and the same input columns of ``o_proj``.
- KV heads: with ``tp <= Hkv`` the same rule (``Hkv % tp == 0``). With ``tp > Hkv`` each rank
  holds one KV head, replicated on ``tp / Hkv`` ranks (``tp % Hkv == 0``): rank r holds KV head
  ``r // (tp / Hkv)``, which is exactly the KV head its query heads read under GQA.
- Column-parallel linears (q/k/v, gate/up): rank r holds output rows ``[r*N/tp, (r+1)*N/tp)`` of
  every stacked weight; row-parallel linears (o_proj, down_proj): input columns likewise, and
  their partial outputs are summed by ``comm.all_reduce``. Hidden states are replicated.
- Vocabulary (embedding, LM head): rows padded to ``tp * ceil(V/tp)``; rank r holds rows
  ``[r*ceil(V/tp), (r+1)*ceil(V/tp))`` (the padding rows of the last rank are zero). The
  embedding zeroes tokens outside the rank's range and all-reduces; the LM head all-gathers the
  per-rank logits along the vocabulary and drops the padding.
- MoE: ``ep`` divides ``tp``; the tp ranks form ``ep`` groups of ``moe_tp = tp / ep``
  consecutive ranks. Rank r is in expert group ``r // moe_tp`` and holds experts
  ``[g*E/ep, (g+1)*E/ep)`` with their intermediate dimension split ``moe_tp`` ways (rows of the
  gate/up weights, columns of down) at ``r % moe_tp``. Every rank routes all of its (replicated)
  tokens, computes the experts it holds, and one all-reduce sums the partial outputs.
- GGUF blocks: a split of a weight's input columns must fall on a block boundary (32 weights for
  Q4_0/Q4_1/Q8_0); otherwise loading stops with an error naming the tensor and the sizes.

Everything that does not divide raises ``ConfigError`` from ``check_model_split`` before any
weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Slice:
    """Rows (or columns) ``[start, start + size)`` of a full checkpoint dimension."""

    start: int
    size: int


def even_split(total: int, parts: int, index: int) -> Slice:
    """Part ``index`` of ``total`` split into ``parts`` equal parts (``parts`` divides ``total``)."""
    if total % parts:
        raise ValueError(f"{total} does not split into {parts} equal parts")
    size = total // parts
    return Slice(index * size, size)


def kv_head_slice(num_kv_heads: int, tp_size: int, tp_rank: int) -> Slice:
    """The KV heads rank ``tp_rank`` holds (one replicated head when tp exceeds Hkv)."""
    if tp_size <= num_kv_heads:
        return even_split(num_kv_heads, tp_size, tp_rank)
    if tp_size % num_kv_heads:
        raise ValueError(f"tensor-parallel size {tp_size} is not a multiple of the {num_kv_heads} "
                         "KV heads")
    return Slice(tp_rank // (tp_size // num_kv_heads), 1)


def vocab_slice(vocab_size: int, tp_size: int, tp_rank: int) -> tuple[Slice, int]:
    """(the real vocabulary rows this rank holds, rows allocated per rank incl. padding)."""
    per_rank = -(-vocab_size // tp_size)
    start = min(tp_rank * per_rank, vocab_size)
    return Slice(start, min(per_rank, vocab_size - start)), per_rank


@dataclass(frozen=True)
class ExpertShard:
    """Which experts, and which part of their intermediate dimension, one rank holds."""

    first_expert: int
    num_experts: int  # experts held on this rank
    inter: Slice  # of the full intermediate size

    @classmethod
    def for_rank(cls, num_experts: int, intermediate: int, tp_size: int, tp_rank: int,
                 ep_size: int) -> ExpertShard:
        moe_tp = tp_size // ep_size
        experts = even_split(num_experts, ep_size, tp_rank // moe_tp)
        return cls(experts.start, experts.size, even_split(intermediate, moe_tp, tp_rank % moe_tp))

    def local(self, expert: int) -> int | None:
        """Index among this rank's experts, None when another rank holds it."""
        e = expert - self.first_expert
        return e if 0 <= e < self.num_experts else None


def model_split_facts(config: Any) -> dict[str, int]:
    """The sizes of a Hugging Face config that tensor / expert parallelism must divide."""
    heads = config.num_attention_heads
    dense = int(getattr(config, "intermediate_size", 0) or 0)
    facts = {"num_heads": heads,
             "num_kv_heads": getattr(config, "num_key_value_heads", None) or heads,
             "intermediate_size": dense}
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if experts:
        moe_inter = getattr(config, "moe_intermediate_size", None)
        facts["num_experts"] = int(experts)
        facts["moe_intermediate_size"] = int(moe_inter or dense)
        has_dense_layers = moe_inter is not None and (
            getattr(config, "mlp_only_layers", None) or (getattr(config, "decoder_sparse_step", 1)
                                                         or 1) > 1)
        if not has_dense_layers:
            facts["intermediate_size"] = 0  # every MLP is a MoE block (Mixtral)
    return facts


def check_model_split(config: Any, tp_size: int, ep_size: int = 1) -> None:
    """ConfigError (naming the values) when tp / ep do not divide this model's heads, KV heads,
    intermediate sizes or experts. Call it before any weight is read."""
    from infer.core.config.validate import check_parallel_split

    check_parallel_split(tp_size, ep_size, **model_split_facts(config))
