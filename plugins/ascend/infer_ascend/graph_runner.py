"""ACL graphs (``torch.npu.NPUGraph``) for decode batches, one per captured batch size.

Per size bs the runner owns a static decode ForwardBatch (input ids, positions, attention
metadata with block tables as wide as the longest sequence, logits rows 0..bs-1) and the logits
the graph writes. A decode batch of n <= bs rows is copied into the first n rows; padding rows
are seq_len 1, a block-table row of zeros and slot 0, so they read and write only the model
runner's scratch page 0.

What differs from CUDA graphs: the fused attention takes the KV lengths as host-side lists,
which a captured graph keeps as they were at capture. Graphs are therefore captured with
``auto_dispatch_capture=True`` and, before every replay, ``graph.update(cpu_update_input=...)``
hands each layer's attention this batch's lengths (``AscendAttention.graph_update_input``).

Sizes: ``--cuda-graph-bs`` (explicit) or up to ``--cuda-graph-max-bs`` (default 64, capped by
``--max-running-requests``); ``--disable-cuda-graph-padding`` replays exact sizes only;
``--disable-cuda-graph`` turns the runner off (the model runner then creates none).
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

import torch
from infer.core.config.views import GraphConfig
from infer.core.ops.graph import GraphRunner, copy_decode_batch

from infer_ascend.platform import npu

log = logging.getLogger(__name__)

DEFAULT_MAX_BS = 64


def capture_sizes(graph: GraphConfig) -> list[int]:
    if graph.batch_sizes:
        return sorted({int(b) for b in graph.batch_sizes if int(b) > 0})
    max_bs = graph.max_bs or DEFAULT_MAX_BS
    if graph.max_running_requests:
        max_bs = min(max_bs, int(graph.max_running_requests))
    sizes = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    return sorted(set(sizes) | {max_bs})


class AclGraphRunner(GraphRunner):
    def __init__(self, model_runner: Any, graph: GraphConfig) -> None:
        self.mr = model_runner
        self.sizes = capture_sizes(graph)
        self.padding = not graph.disable_padding
        self.enabled = bool(getattr(model_runner.attn_backend, "supports_graph_capture", False))
        if not self.enabled:
            log.warning("attention backend %s cannot be captured in an ACL graph; decode runs "
                        "eagerly", getattr(model_runner.attn_backend, "name", "?"))
        self.graphs: dict[int, Any] = {}
        self.static: dict[int, Any] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.replays = 0

    def _static_batch(self, bs: int) -> Any:
        d = self.mr.make_decode_inputs(bs)
        d.block_tables = [[0] * self.mr.max_pages_per_seq for _ in range(bs)]
        return self.mr.build_forward_batch(d)

    @torch.inference_mode()
    def capture(self) -> None:
        if not self.enabled:
            return
        n = npu()
        pool = n.graph_pool_handle()
        stream = n.Stream()
        backend = self.mr.attn_backend
        for bs in sorted(self.sizes, reverse=True):  # largest first: smaller ones reuse its pool
            fwd = self._static_batch(bs)
            backend.plan(fwd.attn)
            self.mr.model(fwd)  # warm-up outside the graph (kernel selection, workspaces)
            # plan again: per-batch device tensors the backend derives in its first layer (the
            # int32 slots) must be made inside the capture, or replays would reuse the warm-up's
            backend.plan(fwd.attn)
            graph = n.NPUGraph()
            with n.graph(graph, pool=pool, stream=stream, auto_dispatch_capture=True):
                self.logits[bs] = self.mr.model(fwd)  # [bs, V]
            self.graphs[bs], self.static[bs] = graph, fwd
        n.synchronize()
        log.info("captured ACL graphs for decode batch sizes %s", sorted(self.graphs))

    def _size_for(self, n: int) -> int | None:
        sizes = sorted(self.graphs)
        i = bisect.bisect_left(sizes, n)
        if i == len(sizes) or (sizes[i] != n and not self.padding):
            return None
        return sizes[i]

    def can_run(self, batch: Any) -> bool:
        meta = batch.attn
        return (self.enabled and meta.is_decode_only and self._size_for(meta.num_seqs) is not None
                and meta.block_tables.shape[1] <= self.mr.max_pages_per_seq)

    @torch.inference_mode()
    def run(self, batch: Any) -> torch.Tensor:
        """Logits [n, V] of a decode batch that ``can_run`` accepts."""
        n = batch.attn.num_seqs
        bs = self._size_for(n)
        assert bs is not None, "run() called for a batch that can_run() rejects"
        st = self.static[bs]
        meta = st.attn
        copy_decode_batch(st, batch, bs)
        backend = self.mr.attn_backend
        backend.plan(meta)
        graph = self.graphs[bs]
        graph.update(cpu_update_input=backend.graph_update_input())
        graph.replay()
        self.replays += 1
        return self.logits[bs][:n]
