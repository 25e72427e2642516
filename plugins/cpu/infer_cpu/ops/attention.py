"""``torch_native`` on the CPU: the core's reference backend plus the native paged-attention kernel.

Every batch of a float32 model on the CPU (a GGUF file's dequantised weights) over a float32,
fp16 (a GGUF file's default on the CPU) or bf16 (``--kv-cache-dtype bf16``) cache (16-bit caches:
the new keys and values rounded to nearest even as they are written; half the memory) runs ``infer_cpu.kernels.paged_decode``: one call
writes the step's new k/v and then attends each query row over its own sequence's pages. A
decode row is one query per sequence; a prefill or extend row t of sequence i is a query that
sees the first ``prefix_len_i + t + 1`` keys. Each row's arithmetic depends only on its query and
those keys (keys reduced in a fixed order), never on how the sequence was split into prefill,
extend and decode steps or batched with others, so cached, chunked and batched requests get the
same bits.

A bf16 model's bf16 cache runs ``infer_cpu.kernels.bf16.paged_attention`` (the per-op path:
prefill, extend over a cached prefix, and decode when the graph is off): one call per layer
writes the new k/v and attends per (sequence, KV head, block of query rows) with the bf16 GEMM
(scores and probabilities as SDPA on bf16 inputs computes them, up to float32 summation order).

With a bf16 cache the backend also picks the thread count of the step's bf16 kernels (GEMMs,
norms, attention: ``kb.set_call_threads``) per size class of the step's tokens, by
``kb.ThreadChoice`` on the time from its first layer's attention call to its last (measured at
the next ``plan``); ``INFER_CPU_BF16_PREFILL_THREADS`` fixes it.

Any input a kernel declines, and every other cache dtype, runs the reference
(``infer.core.ops.reference.attention``), which the kernels are tested against.
"""

from __future__ import annotations

import os
import time

import torch
from infer.core.ops.attention import AttentionConfig, AttentionMetadata
from infer.core.ops.reference.attention import TorchNativeAttention as ReferenceAttention

from infer_cpu import kernels
from infer_cpu.kernels import bf16 as kb


def query_rows(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row: its sequence's block-table row [T, W] int32 and the number of keys it sees
    [T] int32 (its position + 1): the form ``kernels.paged_decode`` and the GGUF graph's native
    call attend prefill, extend and decode rows in."""
    if meta.is_decode_only:
        return meta.block_tables, meta.seq_lens
    ext = torch.tensor(meta.extend_lens_cpu, dtype=torch.int64)
    seq = torch.repeat_interleave(torch.arange(meta.num_seqs), ext)  # [T] sequence of row
    start = torch.cumsum(ext, 0) - ext  # first row of each sequence
    prefix = torch.tensor(meta.prefix_lens_cpu, dtype=torch.int64)
    seen = prefix[seq] + torch.arange(meta.num_tokens) - start[seq] + 1
    return (meta.block_tables.index_select(0, seq.to(meta.block_tables.device)).contiguous(),
            seen.to(torch.int32).to(meta.seq_lens.device))


class TorchNativeAttention(ReferenceAttention):
    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        self._threads = kb.ThreadChoice(torch.get_num_threads(),
                                        int(os.environ.get("INFER_CPU_BF16_PREFILL_THREADS", "0")))
        self._step: list | None = None  # [tokens, threads, first call's time, last call's time]
        if config.deterministic and not self._kernel_fits():
            from infer_cpu.quant.methods import refuse_nondeterministic

            refuse_nondeterministic(f"attention over a {config.kv_dtype} KV cache (torch SDPA)")

    def _kernel_fits(self) -> bool:
        """float32 queries (float32 models: GGUF files) over a float32, bf16 or fp16 cache."""
        c = self.config
        return (c.dtype == torch.float32 and c.kv_dtype in kernels.KV_CODES
                and c.device.type == "cpu" and kernels.load() is not None)

    def _bf16_fits(self) -> bool:
        c = self.config
        return (c.dtype != torch.float32 and c.kv_dtype == torch.bfloat16
                and c.device.type == "cpu" and kb.load() is not None)

    def plan(self, meta: AttentionMetadata) -> None:
        self._native = self._kernel_fits()
        self._bf16 = not self._native and self._bf16_fits()
        if self._bf16:
            self.meta = meta
            self._ext = torch.tensor(meta.extend_lens_cpu, dtype=torch.int32)
            self._seq = torch.tensor(meta.seq_lens_cpu, dtype=torch.int32)
            step = self._step
            if step is not None and step[3] > step[2]:  # the previous step's layers
                self._threads.record(step[0], step[1], step[3] - step[2])
            threads = self._threads.pick(meta.num_tokens)
            kb.set_call_threads(threads)
            self._step = [meta.num_tokens, threads, 0.0, 0.0]
        elif self._native:
            self.meta = meta  # the reference's plans are made only if the kernel declines
            self._rows = query_rows(meta)
        else:
            super().plan(meta)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D], caches [P, page, Hkv, D] -> [T, H, D]."""
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        if self._bf16:
            now = time.perf_counter()
            if self._step is not None:
                self._step[3] = now
                self._step[2] = self._step[2] or now
            out = kb.paged_attention(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                     meta.block_tables, self._seq, self._ext, meta.page_size,
                                     self.config.scale)
            if out is not None:
                return out
            self._bf16 = False  # inputs the kernel does not take: the reference, this step
            super().plan(meta)
        elif self._native:
            tables, seen = self._rows
            out = kernels.paged_decode(q, k, v, k_cache, v_cache, meta.slot_mapping, tables, seen,
                                       meta.page_size, self.config.scale)
            if out is not None:
                return out
            if self.config.deterministic:
                from infer_cpu.quant.methods import refuse_nondeterministic

                refuse_nondeterministic(f"attention on {q.dtype} queries of {tuple(q.shape)}")
            self._native = False  # inputs the kernel does not take: the reference, this step
            super().plan(meta)
        return super().forward(q, k, v, k_cache, v_cache, layer_id)
