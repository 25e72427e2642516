"""CUDA graphs: decode batches per batch size, and single-sequence extend (prefill) batches per
token bucket; inputs copied in place, then replay.

Decode: per captured size ``bs`` the runner owns a static ForwardBatch (input_ids, positions,
attention metadata with block tables as wide as the longest sequence, logits rows 0..bs-1) and the
logits tensor the graph writes. A decode batch of n <= bs rows is copied into the first n rows;
padding rows are seq_len 1, a block-table row of zeros and slot 0, so they read and write only the
model runner's scratch page 0.

Extend (``--enable-piecewise-cuda-graph``): one extend batch of ONE sequence (a fresh prompt or a
chunk, with or without a cached prefix) of n <= ``--piecewise-cuda-graph-max-tokens`` new tokens
and one logits row replays the graph of the smallest captured token bucket N >= n. Unlike
SGLang, which splits its graph around attention (piecewise) because its attention kernels plan on
the host, we capture the WHOLE forward, attention included: the Triton extend kernel reads the
sequence's extent (query_start_loc), prefix length and block table from device tensors, and its
launch grid depends only on the host ``max_extend_len``, fixed to N per graph. The static batch
holds N tokens; the real ones are copied into rows 0..n-1 and the metadata keeps the real length
(query_start_loc [0, n], seq_len prefix + n), so no real query sees a padding key. Padding rows
n..N-1 are token 0 at position 0 written to slot 0 (the scratch page 0 the decode graphs use);
the extend kernel writes zeros as their attention output (rows past the last sequence), so they
stay finite and every other op is row-wise. The block table is a static [1, max_pages_per_seq]
buffer and ``logits_indices`` a static [1] tensor, both copied in place. Other batches (several
sequences, prompt-logprob rows, more tokens than the largest bucket) run eagerly. The backend
must declare ``supports_extend_graph_capture`` (only ``triton`` does: FlashInfer plans prefill on
the host), else start-up fails with an error naming the flag.

All graphs share one memory pool; the extend graphs (bigger) are captured first, each kind
largest first, so smaller graphs reuse the larger ones' freed activations.

Tensor parallelism: every rank captures its shard's forward, the communicator's collectives
included (``infer_cuda.ops.comm``: NCCL kernels issued on the capturing stream, so a replay runs
the all-reduces inside the graph with no host round trip, as vLLM's pynccl and SGLang's graphs
do). Before the first capture the runner calls ``comm.warmup()`` (NCCL sets its communicator up
on the first collective, which must not happen while capturing). The ranks capture the same
sizes in the same order (they come from the same flags) and the warm-up forwards before each
capture run their collectives eagerly, so the ranks meet in every one of them; every rank then
replays the graph of the same size on the same step (the same batch reaches every rank).

Settings: ``--cuda-graph-bs`` (explicit sizes) or ``--cuda-graph-max-bs`` (default 128),
``--disable-cuda-graph-padding`` (replay only exact sizes / token buckets, else run eagerly).
``--piecewise-cuda-graph-tokens`` (explicit buckets) or buckets up to
``--piecewise-cuda-graph-max-tokens`` (default 4096 as SGLang's, clamped by the context length
and ``--chunked-prefill-size``). ``--disable-cuda-graph`` turns every graph off (the model runner
creates no runner).
``--enable-torch-compile``: decode sizes up to ``--torch-compile-max-bs`` (default 32) capture a
``torch.compile``d forward instead (Inductor fuses the norms, rotary and activations between the
GEMMs; our Triton attention / MoE launchers are excluded from tracing and stay as they are);
extend graphs always capture the eager forward (no compilation per bucket). The backend must
declare ``supports_graph_capture`` for decode graphs; otherwise no decode graph is captured and
decode runs eagerly (logged once).
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

import torch
from infer.core.config.flags import ConfigError
from infer.core.config.validate import check_piecewise_tokens
from infer.core.config.views import GraphConfig
from infer.core.ops.attention import AttentionMetadata
from infer.core.ops.forward_batch import ForwardBatch
from infer.core.ops.graph import GraphRunner, copy_decode_batch

log = logging.getLogger(__name__)

DEFAULT_MAX_BS = 128
DEFAULT_PIECEWISE_MAX_TOKENS = 4096  # SGLang's --piecewise-cuda-graph-max-tokens default
# default token buckets: at most 50% padding below 512 tokens, then steps of 128, then 256
_SMALL_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640, 768, 896, 1024)


def capture_sizes(graph: GraphConfig) -> list[int]:
    """Sorted batch sizes to capture, from --cuda-graph-bs or up to --cuda-graph-max-bs."""
    if graph.batch_sizes:
        return sorted({int(b) for b in graph.batch_sizes if int(b) > 0})
    max_bs = graph.max_bs or DEFAULT_MAX_BS
    max_running = graph.max_running_requests
    if max_running:
        max_bs = min(max_bs, int(max_running))
    sizes = [b for b in (1, 2, 4, 8, 12) if b <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(set(sizes))


def extend_token_buckets(graph: GraphConfig, context_length: int) -> list[int]:
    """Sorted token counts to capture extend graphs for; [] unless --enable-piecewise-cuda-graph.

    --piecewise-cuda-graph-tokens is taken as given (each in 2..max tokens); otherwise the default
    buckets up to min(max tokens, context length, --chunked-prefill-size when > 0), that cap
    included. A 1-token extend is a decode row (decode graphs), hence the lower bound 2."""
    if not graph.enable_piecewise:
        return []
    max_tokens = graph.piecewise_max_tokens
    max_tokens = DEFAULT_PIECEWISE_MAX_TOKENS if max_tokens is None else max_tokens
    explicit = check_piecewise_tokens(max_tokens, graph.piecewise_tokens)
    if explicit is not None:
        return explicit
    cap = min(max_tokens, context_length)
    chunk = graph.chunked_prefill_size
    if chunk is not None and chunk > 0:
        cap = min(cap, chunk)
    sizes = [n for n in _SMALL_BUCKETS if n <= cap] + list(range(1280, cap + 1, 256))
    if cap >= 2:
        sizes.append(cap)
    return sorted(set(sizes))


def pick_size(sizes: list[int], n: int, padding: bool) -> int | None:
    """The captured size a batch of n rows / tokens replays in: n itself, else (when padding is
    allowed) the next larger one; None when none covers it. ``sizes`` is sorted."""
    i = bisect.bisect_left(sizes, n)
    if i == len(sizes) or (sizes[i] != n and not padding):
        return None
    return sizes[i]


def extend_bucket(batch: ForwardBatch, buckets: list[int], max_pages: int, padding: bool
                  ) -> int | None:
    """The token bucket whose extend graph covers ``batch``, or None (not an extend batch the
    graphs cover: decode-only, several sequences, several logits rows, too many tokens, or a
    block table wider than the static one). Reads host-side fields only."""
    meta = batch.attn
    if (meta.is_decode_only or meta.num_seqs != 1 or batch.logits_indices.shape[0] != 1
            or meta.block_tables.shape[1] > max_pages):
        return None
    return pick_size(buckets, meta.num_tokens, padding)


def static_extend_batch(n: int, max_pages: int, page_size: int, kv_cache: Any,
                        device: torch.device) -> ForwardBatch:
    """Capture inputs for bucket n: one sequence of n tokens at position 0 in scratch page 0.
    ``max_extend_len`` n fixes the extend kernel's grid; the lengths live in the tensors."""
    def z(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    meta = AttentionMetadata(
        num_seqs=1, num_tokens=n, page_size=page_size,
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=device), prefix_lens=z(1),
        block_tables=z(1, max_pages), slot_mapping=z(n, dtype=torch.int64),
        seq_lens_cpu=[n], extend_lens_cpu=[n], max_seq_len=n, max_extend_len=n)
    return ForwardBatch(input_ids=z(n, dtype=torch.int64), positions=z(n, dtype=torch.int64),
                        attn=meta, logits_indices=torch.tensor([n - 1], device=device),
                        kv_cache=kv_cache)


def load_extend_inputs(st: ForwardBatch, src: ForwardBatch) -> None:
    """Copy a one-sequence extend batch of n tokens into a bucket's static batch, in place.

    Rows 0..n-1 get the real tokens; padding rows are token 0, position 0, slot 0. The metadata
    keeps the real extent (query_start_loc, seq/prefix lens), so the kernels never treat a
    padding row as part of the sequence; ``num_tokens`` / ``max_extend_len`` stay the bucket's."""
    n = src.attn.num_tokens
    meta, a = st.attn, src.attn
    st.input_ids[:n].copy_(src.input_ids)
    st.input_ids[n:].zero_()
    st.positions[:n].copy_(src.positions)
    st.positions[n:].zero_()
    meta.slot_mapping[:n].copy_(a.slot_mapping)
    meta.slot_mapping[n:].zero_()
    meta.query_start_loc.copy_(a.query_start_loc)
    meta.seq_lens.copy_(a.seq_lens)
    meta.prefix_lens.copy_(a.prefix_lens)
    width = a.block_tables.shape[1]
    meta.block_tables[:, :width].copy_(a.block_tables)
    meta.block_tables[:, width:].zero_()
    st.logits_indices.copy_(src.logits_indices)
    meta.seq_lens_cpu = list(a.seq_lens_cpu)
    meta.extend_lens_cpu = list(a.extend_lens_cpu)
    meta.max_seq_len = a.max_seq_len


class CudaGraphRunner(GraphRunner):
    def __init__(self, model_runner: Any, graph: GraphConfig) -> None:
        self.mr = model_runner
        self.sizes = capture_sizes(graph)
        self.padding = not graph.disable_padding
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static: dict[int, ForwardBatch] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.compile_max_bs = 0
        if graph.enable_torch_compile:
            self.compile_max_bs = graph.torch_compile_max_bs
        self._compiled: Any = None
        backend = model_runner.attn_backend
        # a pipeline stage's send/recv cannot be captured: such a rank runs eagerly
        self.enabled = bool(getattr(backend, "supports_graph_capture", False)) and \
            getattr(getattr(getattr(model_runner, "loaded", None), "ctx", None), "pipeline", None) is None
        if not self.enabled:
            log.warning("attention backend %s cannot be captured in a CUDA graph; decode runs "
                        "eagerly", getattr(backend, "name", "?"))
        self.ext_buckets = extend_token_buckets(graph, model_runner.context_length)
        if self.ext_buckets and not getattr(backend, "supports_extend_graph_capture", False):
            raise ConfigError(
                f"--enable-piecewise-cuda-graph: attention backend "
                f"{getattr(backend, 'name', '?')!r} cannot be captured for extend batches (it "
                "plans prefill on the host); use --attention-backend triton, or drop the flag")
        self.ext_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.ext_static: dict[int, ForwardBatch] = {}
        self.ext_logits: dict[int, torch.Tensor] = {}
        self._captured: list[int] = []  # sorted keys of graphs / ext_graphs, set by capture()
        self._ext_captured: list[int] = []
        # replays so far: decode, extend, extend over a cached prefix (tests and logs read them)
        self.stats = {"decode": 0, "extend": 0, "extend_with_prefix": 0}

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

    def _capture_one(self, model: Any, fwd: ForwardBatch, pool: Any, stream: torch.cuda.Stream
                     ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        self.mr.attn_backend.plan(fwd.attn)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton / Inductor compilation, cuBLAS handles
                model(fwd)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            logits = model(fwd)  # [rows, V]
        return graph, logits

    def _warm_communicator(self) -> None:
        """Under tensor parallelism: set the communicator up before anything is captured."""
        ctx = getattr(getattr(self.mr, "loaded", None), "ctx", None)
        if ctx is not None and getattr(ctx, "tp_size", 1) > 1:
            ctx.comm.warmup()

    @torch.inference_mode()
    def capture(self) -> None:
        if not self.enabled and not self.ext_buckets:
            return
        self._warm_communicator()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for n in sorted(self.ext_buckets, reverse=True):  # the eager forward, never compiled
            fwd = static_extend_batch(n, self.mr.max_pages_per_seq, self.mr.page_size,
                                      self.mr.kv_cache, self.mr.device)
            self.ext_graphs[n], self.ext_logits[n] = self._capture_one(self.mr.model, fwd, pool, stream)
            self.ext_static[n] = fwd
        if self.enabled:
            for bs in sorted(self.sizes, reverse=True):
                fwd = self._static_batch(bs)
                self.graphs[bs], self.logits[bs] = self._capture_one(
                    self._forward_for(bs), fwd, pool, stream)
                self.static[bs] = fwd
        torch.cuda.synchronize()
        self._captured, self._ext_captured = sorted(self.graphs), sorted(self.ext_graphs)
        if self.enabled:
            log.info("captured CUDA graphs for decode batch sizes %s", self.sizes)
        if self.ext_buckets:
            log.info("captured CUDA graphs for one-sequence extend batches of up to %s tokens "
                     "(buckets %s)", self.ext_buckets[-1], self.ext_buckets)

    # -- replay --------------------------------------------------------------------------------
    def _size_for(self, n: int) -> int | None:
        return pick_size(self._captured, n, self.padding)

    def _bucket_for(self, batch: ForwardBatch) -> int | None:
        return extend_bucket(batch, self._ext_captured, self.mr.max_pages_per_seq,
                             self.padding)

    def can_run(self, batch: ForwardBatch) -> bool:
        if batch.attn.is_decode_only:
            return self.enabled and self._size_for(batch.attn.num_seqs) is not None
        return self._bucket_for(batch) is not None

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [len(batch.logits_indices), V] of a batch that ``can_run`` accepts."""
        if not batch.attn.is_decode_only:
            return self._run_extend(batch)
        n = batch.attn.num_seqs
        bs = self._size_for(n)
        assert bs is not None, "run() called for a batch that can_run() rejects"
        st = self.static[bs]
        meta = st.attn
        copy_decode_batch(st, batch, bs)
        self.mr.attn_backend.plan(meta)  # in place: the Triton backend keeps its launch shapes
        self.graphs[bs].replay()
        self.stats["decode"] += 1
        return self.logits[bs][:n]

    def _run_extend(self, batch: ForwardBatch) -> torch.Tensor:
        bucket = self._bucket_for(batch)
        assert bucket is not None, "run() called for an extend batch that can_run() rejects"
        st = self.ext_static[bucket]
        load_extend_inputs(st, batch)
        self.mr.attn_backend.plan(st.attn)  # extend: no launch-shape state to update
        self.ext_graphs[bucket].replay()
        self.stats["extend"] += 1
        if batch.attn.seq_lens_cpu[0] > batch.attn.extend_lens_cpu[0]:
            self.stats["extend_with_prefix"] += 1
        return self.ext_logits[bucket]  # [1, V]
