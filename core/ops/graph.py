"""Decode graph-capture interface (CUDA graphs, ACL graphs, HPU graphs)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class GraphRunner(ABC):
    """Captures decode steps for a set of batch sizes and replays them.

    ``can_run(batch)`` says whether a captured graph covers this batch (for CUDA / ACL / HPU
    graphs: decode-only and not larger than the largest captured size); ``run(batch)`` pads to the
    next captured size, updates the static inputs and attention metadata in place, replays and
    returns logits for the real rows. A runner may cover extend batches too (the CPU plugin's
    native bf16 stack runs prefills as one call); ``run`` then returns logits for
    ``batch.logits_indices``, as the eager model does.
    """

    @abstractmethod
    def capture(self) -> None: ...

    @abstractmethod
    def can_run(self, batch: Any) -> bool: ...

    @abstractmethod
    def run(self, batch: Any) -> Any: ...


def copy_decode_batch(static: Any, batch: Any, bs: int) -> None:
    """Copy a decode-only ForwardBatch of n <= ``bs`` rows into a graph's static ForwardBatch of
    ``bs`` rows, in place, with the padding the graph-runner contract fixes (infer.core.engine.
    model_runner): padding rows are one token at position 0 in the scratch page 0 (seq_len 1,
    slot 0, a block-table row of zeros). Host-side lengths are set too; the caller plans the
    attention backend on ``static.attn`` next, then replays."""
    n, src, meta = batch.attn.num_seqs, batch.attn, static.attn
    static.input_ids[:n].copy_(batch.input_ids)
    static.positions[:n].copy_(batch.positions)
    meta.seq_lens[:n].copy_(src.seq_lens)
    meta.prefix_lens[:n].copy_(src.prefix_lens)
    meta.slot_mapping[:n].copy_(src.slot_mapping)
    width = src.block_tables.shape[1]
    meta.block_tables[:n, :width].copy_(src.block_tables)
    meta.block_tables[:n, width:].zero_()
    if n < bs:
        static.input_ids[n:].zero_()
        static.positions[n:].zero_()
        meta.seq_lens[n:].fill_(1)
        meta.prefix_lens[n:].zero_()
        meta.slot_mapping[n:].zero_()
        meta.block_tables[n:].zero_()
    meta.seq_lens_cpu = list(src.seq_lens_cpu) + [1] * (bs - n)
    meta.extend_lens_cpu = [1] * bs
    meta.max_seq_len = max(meta.seq_lens_cpu)
