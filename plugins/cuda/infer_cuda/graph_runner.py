"""CUDA-graph decode: capture one graph per batch size, replay with inputs copied in place.

Per captured size ``bs`` the runner owns a static ForwardBatch (input_ids, positions, attention
metadata with block tables as wide as the longest sequence, logits rows 0..bs-1) and the logits
tensor the graph writes. A decode batch of n <= bs rows is copied into the first n rows; padding
rows are seq_len 1, a block-table row of zeros and slot 0, so they read and write only the
model runner's scratch page 0. All graphs share one memory pool, largest captured first.

Settings: ``--cuda-graph-bs`` (explicit sizes) or ``--cuda-graph-max-bs`` (default 128),
``--disable-cuda-graph-padding`` (replay only exact sizes, else run eagerly).
``--enable-torch-compile``: sizes up to ``--torch-compile-max-bs`` (default 32) capture a
``torch.compile``d forward instead (Inductor fuses the norms, rotary and activations between the
GEMMs; our Triton attention / MoE launchers are excluded from tracing and stay as they are). The backend must
declare ``supports_graph_capture``; otherwise nothing is captured and every step runs eagerly
(logged once).
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

import torch
from infer.core.engine.forward_batch import ForwardBatch
from infer.core.ops.graph import GraphRunner

log = logging.getLogger(__name__)

DEFAULT_MAX_BS = 128


def capture_sizes(server_args: Any) -> list[int]:
    """Sorted batch sizes to capture, from --cuda-graph-bs or up to --cuda-graph-max-bs."""
    explicit = getattr(server_args, "cuda_graph_bs", None)
    if explicit:
        return sorted({int(b) for b in explicit if int(b) > 0})
    max_bs = getattr(server_args, "cuda_graph_max_bs", None) or DEFAULT_MAX_BS
    max_running = getattr(server_args, "max_running_requests", None)
    if max_running:
        max_bs = min(max_bs, int(max_running))
    sizes = [b for b in (1, 2, 4, 8, 12) if b <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(set(sizes))


class CudaGraphRunner(GraphRunner):
    def __init__(self, model_runner: Any, server_args: Any) -> None:
        self.mr = model_runner
        self.sizes = capture_sizes(server_args)
        self.padding = not getattr(server_args, "disable_cuda_graph_padding", False)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static: dict[int, ForwardBatch] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.compile_max_bs = 0
        if getattr(server_args, "enable_torch_compile", False):
            self.compile_max_bs = int(getattr(server_args, "torch_compile_max_bs", None) or 32)
        self._compiled: Any = None
        self.enabled = bool(getattr(model_runner.attn_backend, "supports_graph_capture", False))
        if not self.enabled:
            log.warning("attention backend %s cannot be captured in a CUDA graph; decode runs "
                        "eagerly", getattr(model_runner.attn_backend, "name", "?"))

    # -- capture -------------------------------------------------------------------------------
    def _static_batch(self, bs: int) -> ForwardBatch:
        d = self.mr.make_decode_inputs(bs)
        d.block_tables = [[0] * self.mr.max_pages_per_seq for _ in range(bs)]
        return self.mr.build_forward_batch(d)

    def _forward_for(self, bs: int) -> Any:
        if bs > self.compile_max_bs:
            return self.mr.model
        if self._compiled is None:
            import torch._dynamo

            # every decoder layer is its own frame (graph breaks at attention): allow them all
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 1024)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 4096)
            self._compiled = torch.compile(self.mr.model, dynamic=False)
        return self._compiled

    @torch.inference_mode()
    def capture(self) -> None:
        if not self.enabled:
            return
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        backend = self.mr.attn_backend
        for bs in sorted(self.sizes, reverse=True):
            fwd = self._static_batch(bs)
            model = self._forward_for(bs)
            backend.plan(fwd.attn)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton / Inductor compilation, cuBLAS handles
                    model(fwd)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                logits = model(fwd)  # [bs, V]
            self.graphs[bs], self.static[bs], self.logits[bs] = graph, fwd, logits
        torch.cuda.synchronize()
        log.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    # -- replay --------------------------------------------------------------------------------
    def _size_for(self, n: int) -> int | None:
        if n in self.graphs:
            return n
        if not self.padding:
            return None
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def can_run(self, batch: ForwardBatch) -> bool:
        return (self.enabled and batch.attn.is_decode_only
                and self._size_for(batch.attn.num_seqs) is not None)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [n, V] of the batch's n decode rows."""
        n = batch.attn.num_seqs
        bs = self._size_for(n)
        assert bs is not None, "run() called for a batch that can_run() rejects"
        st, src = self.static[bs], batch.attn
        meta = st.attn
        st.input_ids[:n].copy_(batch.input_ids)
        st.positions[:n].copy_(batch.positions)
        meta.seq_lens[:n].copy_(src.seq_lens)
        meta.prefix_lens[:n].copy_(src.prefix_lens)
        meta.slot_mapping[:n].copy_(src.slot_mapping)
        width = src.block_tables.shape[1]
        meta.block_tables[:n, :width].copy_(src.block_tables)
        meta.block_tables[:n, width:].zero_()
        if n < bs:  # padding rows: one token in scratch page 0
            st.input_ids[n:].zero_()
            st.positions[n:].zero_()
            meta.seq_lens[n:].fill_(1)
            meta.prefix_lens[n:].zero_()
            meta.slot_mapping[n:].zero_()
            meta.block_tables[n:].zero_()
        meta.seq_lens_cpu = list(src.seq_lens_cpu) + [1] * (bs - n)
        meta.extend_lens_cpu = [1] * bs
        meta.max_seq_len = max(meta.seq_lens_cpu)
        self.mr.attn_backend.plan(meta)  # in place: the Triton backend keeps its launch shapes
        self.graphs[bs].replay()
        return self.logits[bs][:n]
