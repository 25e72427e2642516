"""ModelRunner: the only place that builds tensors. Owns the KV cache and runs one batch.

Per step: ``run(batch)`` builds a ForwardBatch from the scheduler's plain ScheduleBatch, calls
``attn_backend.plan(meta)`` once, runs the model (or the graph runner for decode batches it
covers), samples every row that needs a token in one vectorised pass, and copies the sampled ids
(and logprobs when asked) to the host once.

Graph-runner contract (a platform plugin registers ``factory(model_runner, graph_config)`` under
``platform.default_graph_runner`` in ``register_graph_runners``; ``graph_config`` is the
``infer.core.config.views.GraphConfig`` view):
  - At start-up the runner calls ``capture()``; it may use ``model_runner.model``,
    ``.attn_backend``, ``.kv_cache``, ``.device``, ``.arch``, ``.page_size``,
    ``.max_pages_per_seq`` and ``.build_forward_batch(DecodeInputs)`` to make ForwardBatch
    objects over its own static buffers (``make_decode_inputs(bs)`` gives dummy decode inputs
    whose rows read and write only the scratch page 0).
  - Per step the runner gets ``can_run(fwd)`` (any batch: it says which ones it covers, decode
    or extend) / ``run(fwd) -> logits [len(fwd.logits_indices), V]`` with the
    eager ForwardBatch (device tensors already built, ``attn_backend.plan`` NOT called): it
    copies ``fwd.input_ids``, ``fwd.positions`` and ``fwd.attn`` tensors into its static
    buffers (padding rows: seq_len 1, block table row of zeros, slot 0), plans in place,
    replays, and returns the logits of the real rows. When ``fwd.greedy_ids`` is set (every
    logit row is a plain greedy sample), it may return their argmax ids instead
    (``[len(fwd.logits_indices)]`` int64, exactly ``logits.argmax(-1)``), and sampling is skipped.

Several tokens per request per step: a ScheduledSeq with ``num_sample`` k has its last k logit
rows sampled; its tokens come back together, in order, in ``StepResult.sampled``. Every step of
today's engine samples k <= 1; speculative verification is what needs k > 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from infer.core.config.views import EngineConfig
from infer.core.engine.request import Request
from infer.core.engine.scheduler import ScheduleBatch
from infer.core.ops.attention import AttentionMetadata, KVCache
from infer.core.ops.forward_batch import ForwardBatch
from infer.core.sampling.sampler import SamplingTensors, prompt_logprobs, sample

log = logging.getLogger(__name__)


@dataclass
class DecodeInputs:
    """Host-side inputs of a decode-only batch (one token per sequence)."""

    input_ids: list[int]
    positions: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int]


@dataclass
class StepInputs:
    """Host-side inputs of one forward, as plain values: what every rank of a multi-rank
    executor needs to run its shard of the step (rank 0 builds it from the ScheduleBatch)."""

    ids: list[int]  # new tokens, packed in sequence order (negative: a deferred step's row)
    pos: list[int]
    extend: list[int]  # new tokens per sequence
    seq_lens: list[int]  # tokens per sequence after this step
    tables: np.ndarray  # [B, W] int64 page ids, rows padded with page 0
    slots: list[int]  # KV slot of each new token
    logit_rows: list[int]  # packed rows whose logits are wanted
    greedy: bool = False  # every logit row is a plain greedy sample: its argmax is all that is used


@dataclass
class LaunchedStep:
    """A step whose device work is queued: ``ModelRunner.resolve`` waits for it and returns its
    StepResult. ``deferred``: its sampled ids were also written to the future-token buffer, row
    i for ``reqs[i]``, so that the next step's inputs can use them before the host sees them."""

    batch: ScheduleBatch
    reqs: list[Request]  # the request of each sampled row, in row order (k rows for k tokens)
    result: StepResult
    deferred: bool = False
    host: torch.Tensor | None = None  # ids (int64 [B]) or ids+logprobs (float64 [B, C])
    wait: Any = None  # blocks until ``host`` holds the copy (None: it already does)
    top_k: int = 0  # top-logprob columns in ``host``


@dataclass
class StepResult:
    """Host-side results of one step, per sampled sequence in batch order."""

    sampled: list[tuple[Request, list[int]]] = field(default_factory=list)  # (req, its new token ids)
    logprobs: dict[str, list[float]] = field(default_factory=dict)  # rid -> logprob of each token
    top_logprobs: dict[str, list[list[tuple[int, float]]]] = field(default_factory=dict)
    # rid -> [(position, logprob of the prompt token at position, top list)]
    prompt_logprobs: dict[str, list[tuple[int, float, list[tuple[int, float]]]]] = \
        field(default_factory=dict)


def kv_layers(loaded: Any) -> range:
    """The layers whose KV cache this rank holds: all, or its pipeline stage's."""
    stage = getattr(loaded.ctx, "pipeline", None)
    return stage.layers if stage is not None else range(loaded.arch.num_layers)


class ModelRunner:
    def __init__(self, loaded: Any, cfg: EngineConfig, num_pages: int, platform: Any,
                 grammar: Any = None) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.arch = loaded.arch
        self.platform = platform
        self.device = torch.device(platform.torch_device)
        self.page_size = page_size = cfg.cache.page_size
        self.num_pages = num_pages
        self.vocab_size = self.arch.vocab_size
        self.context_length = self.arch.context_length
        self.max_pages_per_seq = -(-self.context_length // page_size) + 1
        self.grammar = grammar
        self.attn_backend = loaded.ctx.attn_backend  # built by the loader, with the model
        if self.attn_backend is None:
            raise ValueError("the loaded model has no attention backend (load it with load_model)")
        # this rank's KV heads (all of them on one rank; a shard under tensor parallelism)
        kv_heads = self.attn_backend.config.num_kv_heads
        shape = (num_pages, page_size, kv_heads, self.arch.head_dim)
        owned = kv_layers(loaded)  # every layer, or this pipeline stage's (others get no cache)

        def cache(i: int) -> torch.Tensor:
            if i not in owned:
                return torch.zeros((0,), dtype=self.arch.kv_dtype, device=self.device)
            return platform.cache_zeros(shape, self.arch.kv_dtype)

        self.kv_cache = KVCache(k=[cache(i) for i in range(self.arch.num_layers)],
                                v=[cache(i) for i in range(self.arch.num_layers)])
        # overlap scheduling: row i holds the id sampled for row i of the last deferred step
        self._future = torch.zeros(0, dtype=torch.int64, device=self.device)
        self._tables: dict[str, np.ndarray] = {}  # rid -> host copy of its page list
        self.graph_runner = self._make_graph_runner(cfg.graph)

    # -- graph runner --------------------------------------------------------------------------
    def _make_graph_runner(self, graph: Any) -> Any:
        name = self.platform.default_graph_runner
        if not name or graph.disable:
            return None
        from infer.core.plugins import Registries, get_plugin_host

        factory = Registries.pick(get_plugin_host().registries.graph_runners, name, self.platform.name)
        if factory is None:
            return None
        runner = factory(self, graph)
        runner.capture()
        log.info("graph runner %s captured", name)
        return runner

    def make_decode_inputs(self, bs: int) -> DecodeInputs:
        """Dummy decode inputs for capture: every row one token at position 0 in page 0."""
        return DecodeInputs([0] * bs, [0] * bs, [1] * bs, [[0]] * bs, [0] * bs)

    # -- building tensors ----------------------------------------------------------------------
    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensor -> device, never waiting for queued device work (the platform's copy)."""
        return self.platform.to_device(t)

    def build_forward_batch(self, d: DecodeInputs) -> ForwardBatch:
        """A decode-only ForwardBatch (one new token per sequence) on the device."""
        b = len(d.input_ids)
        return self._forward_batch(d.input_ids, d.positions, [1] * b, d.seq_lens, d.block_tables,
                                   d.slot_mapping, list(range(b)))

    def _forward_batch(self, ids: list[int], pos: list[int], extend: list[int], seq_lens: list[int],
                       tables: np.ndarray | list[list[int]], slots: list[int], logit_rows: list[int]
                       ) -> ForwardBatch:
        """Every index tensor of the step travels to the device in one int64 copy, then is
        split (views) and narrowed to int32 where the metadata wants it. ``tables`` is the
        [B, W] block table (rows padded with page 0)."""
        if not isinstance(tables, np.ndarray):
            width = max(len(x) for x in tables)
            tables = np.array([x + [0] * (width - len(x)) for x in tables], dtype=np.int64)
        b, t, n = len(extend), len(ids), len(logit_rows)
        width = tables.shape[1]
        qsl = [0]
        for e in extend:
            qsl.append(qsl[-1] + e)
        prefix = [s_ - e for s_, e in zip(seq_lens, extend, strict=True)]
        small = torch.tensor(ids + pos + slots + logit_rows + qsl + seq_lens + prefix, dtype=torch.int64)
        host = torch.cat([small, torch.from_numpy(tables.astype(np.int64, copy=False)).view(-1)])
        dev_all = self.to_device(host)
        parts = list(dev_all.split([t, t, t, n, b + 1, b, b, b * width]))
        if ids and min(ids) < 0:  # placeholders of a deferred step: its ids are still on the device
            x = parts[0]
            parts[0] = torch.where(x < 0, self._future[(-x - 1).clamp_(min=0)], x)
        meta = AttentionMetadata(
            num_seqs=b, num_tokens=t, page_size=self.page_size,
            query_start_loc=parts[4].to(torch.int32), seq_lens=parts[5].to(torch.int32),
            prefix_lens=parts[6].to(torch.int32),
            block_tables=parts[7].to(torch.int32).view(b, width), slot_mapping=parts[2],
            seq_lens_cpu=list(seq_lens), extend_lens_cpu=list(extend),
            max_seq_len=max(seq_lens), max_extend_len=max(extend))
        return ForwardBatch(input_ids=parts[0], positions=parts[1], attn=meta,
                            logits_indices=parts[3], kv_cache=self.kv_cache)

    def prepare(self, batch: ScheduleBatch) -> tuple[ForwardBatch, list[tuple[Request, int, int]]]:
        """ForwardBatch for a scheduled batch plus, per sequence, (req, first logit row,
        number of logit rows); the last ``num_sample`` logit rows of a sequence are sampled."""
        inputs, spans = self.host_inputs(batch)
        return self.build_inputs(inputs), spans

    def build_inputs(self, x: StepInputs) -> ForwardBatch:
        fwd = self._forward_batch(x.ids, x.pos, x.extend, x.seq_lens, x.tables, x.slots,
                                  x.logit_rows)
        fwd.greedy_ids = x.greedy
        return fwd

    def host_inputs(self, batch: ScheduleBatch) -> tuple[StepInputs, list[tuple[Request, int, int]]]:
        """The step's StepInputs and, per sequence, (req, first logit row, number of rows)."""
        ps = self.page_size
        ids, pos, extend, seq_lens, slots, rows, spans = [], [], [], [], [], [], []
        n_pages = [-(-(s.req.num_computed + s.extend_len) // ps) for s in batch.seqs]
        tables = np.zeros((len(batch.seqs), max(n_pages)), dtype=np.int64)
        t = 0
        for i, s in enumerate(batch.seqs):
            r, nc, e = s.req, s.req.num_computed, s.extend_len
            if e == 1 and r.output_ids and nc == r.seq_len - 1:
                ids.append(r.output_ids[-1])  # decode row: no copy of the whole sequence
            else:
                ids.extend(r.all_ids[nc:nc + e])
            pos.extend(range(nc, nc + e))
            extend.append(e)
            seq_lens.append(nc + e)
            tables[i, :n_pages[i]] = self._page_row(r, s.pages_from)[:n_pages[i]]
            pages = r.pages
            slots.extend(pages[p // ps] * ps + p % ps for p in range(nc, nc + e))
            first = len(rows)
            k = s.num_sample
            if r.wants_prompt_logprobs:  # rows for positions lo .. nc+e-1
                lo = max(nc, r.logprob_start_len)
                if k:
                    lo = min(lo, nc + e - k)
                rows.extend(range(t + lo - nc, t + e))
            elif k:
                rows.extend(range(t + e - k, t + e))
            spans.append((r, first, len(rows) - first))
            t += e
        if not rows:
            rows = [t - 1]  # the model needs at least one row; its logits are unused
        return StepInputs(ids, pos, extend, seq_lens, tables, slots, rows), spans

    def _page_row(self, r: Request, changed_from: int) -> np.ndarray:
        """The request's page list as a numpy row, refreshed only from ``changed_from`` on (the
        KV manager's mark: earlier entries are as this runner last copied them)."""
        row = self._tables.get(r.rid)
        if row is None or len(row) < len(r.pages):
            row = self._tables[r.rid] = np.zeros(max(self.max_pages_per_seq, len(r.pages)),
                                                 dtype=np.int64)
            changed_from = 0
        if changed_from < len(r.pages):
            row[changed_from:len(r.pages)] = r.pages[changed_from:]
        return row

    def forget(self, rid: str) -> None:
        """A request ended: drop this runner's copy of its page list."""
        self._tables.pop(rid, None)

    # -- running -------------------------------------------------------------------------------
    def run(self, batch: ScheduleBatch) -> StepResult:
        """Run one batch and wait for its results."""
        return self.resolve(self.launch(batch))

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """The model on one step's inputs (a captured graph where one covers them): logits
        [len(logit_rows), V], or, when ``inputs.greedy`` and the graph runner computes them
        itself, their argmax ids [len(logit_rows)] int64. Every rank of a multi-rank executor
        calls this on the same inputs."""
        fwd = self.build_inputs(inputs)
        if self.graph_runner is not None and self.graph_runner.can_run(fwd):
            return self.graph_runner.run(fwd)
        self.attn_backend.plan(fwd.attn)
        return self.model(fwd)  # [N, V]

    @torch.inference_mode()
    def launch(self, batch: ScheduleBatch, defer: bool = False,
               publish: Callable[[StepInputs], None] | None = None) -> LaunchedStep:
        """Queue one batch's forward and sampling on the device; the host does not wait (on an
        asynchronous device) except for prompt logprobs. ``defer``: also write the sampled ids to
        the future-token buffer (row i for the i-th sampled request), for a next step launched
        before this one is resolved. ``publish``: hands the step's inputs to the other ranks
        before this rank runs its shard."""
        inputs, spans = self.host_inputs(batch)
        step = LaunchedStep(batch, [], StepResult(), deferred=defer)
        sample_rows = []
        for s, (req, first, n) in zip(batch.seqs, spans, strict=True):
            k = s.num_sample
            sample_rows.extend(range(first + n - k, first + n))
            step.reqs.extend([req] * k)
        every_row = sample_rows == list(range(len(inputs.logit_rows)))  # one logit row a sample
        # every logit row sampled, every sample plain greedy: argmax is all the step needs
        inputs.greedy = (bool(step.reqs) and every_row
                         and all(self._plain_greedy(r) for r in step.reqs))
        if publish is not None:
            publish(inputs)
        logits = self.forward(inputs)
        if logits.dtype == torch.int64:  # the graph runner's argmax ids (inputs.greedy)
            ids = logits
            if defer:
                self._defer_ids(ids)
            step.host, step.wait = self.platform.to_host_async(ids)
            return step
        if step.reqs:
            if not every_row:  # else: the logits are already one row per sample
                logits_s = logits.index_select(
                    0, self.to_device(torch.tensor(sample_rows, dtype=torch.int64)))
            else:
                logits_s = logits
            ids, packed = self._sample(logits_s, step)
            if defer:
                self._defer_ids(ids)
            # the step's one device->host copy, queued: the host goes on to the next step
            step.host, step.wait = self.platform.to_host_async(packed)
        self._prompt_logprobs(logits, batch, spans, step.result)
        return step

    def _defer_ids(self, ids: torch.Tensor) -> None:
        """Write a launched step's sampled ids to the future-token buffer."""
        b = ids.shape[0]
        if b > self._future.shape[0]:  # the old rows were read by prepare() already
            self._future = torch.empty(b, dtype=torch.int64, device=self.device)
        self._future[:b].copy_(ids)

    def resolve(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step and return its results on the host."""
        res = step.result
        if not step.reqs:
            return res
        if step.wait is not None:
            step.wait()
        reqs = step.reqs
        rows = step.host.tolist()  # ids, or ids, logprobs and top-k columns (ids < 2**53 in float64)
        ids = rows if step.host.dim() == 1 else [int(row[0]) for row in rows]
        for i, r in enumerate(reqs):  # a request's k rows are consecutive
            if i and reqs[i - 1] is r:
                res.sampled[-1][1].append(ids[i])
            else:
                res.sampled.append((r, [ids[i]]))
        if step.host.dim() == 1:
            return res
        k = step.top_k
        for r, row in zip(reqs, rows, strict=True):
            if r.return_logprob:
                res.logprobs.setdefault(r.rid, []).append(row[1])
                if k and r.top_logprobs_num > 0:
                    n = r.top_logprobs_num
                    res.top_logprobs.setdefault(r.rid, []).append([(int(a), b) for a, b in zip(
                        row[2:2 + n], row[2 + k:2 + k + n], strict=True)])
        return res

    def _sample(self, logits: torch.Tensor, step: LaunchedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled ids [B] (int64, on the device) and the tensor to copy to the host: the ids,
        or ids + logprobs (+ top-k ids and logprobs) packed into one float64 matrix."""
        reqs = step.reqs
        if all(self._plain_greedy(r) for r in reqs):  # fast path: no per-row inputs at all
            ids = self.platform.greedy_ids(logits)
            return ids, ids
        out = sample(logits, self.sampling_tensors(reqs))
        if out.logprobs is None:
            return out.ids, out.ids
        cols = [out.ids[:, None].double(), out.logprobs[:, None].double()]
        if out.top_logprobs is not None:
            step.top_k = out.top_logprobs.shape[1]
            cols += [out.top_ids.double(), out.top_logprobs.double()]
        return out.ids, torch.cat(cols, dim=1)

    def _prompt_logprobs(self, logits: torch.Tensor, batch: ScheduleBatch,
                         spans: list[tuple[Request, int, int]], res: StepResult) -> None:
        for s, (req, first, n) in zip(batch.seqs, spans, strict=True):
            if not req.wants_prompt_logprobs or n == 0:
                continue
            lo = max(req.num_computed, req.logprob_start_len)
            n_rows = n - s.num_sample  # rows whose next token is a known prompt token
            if n_rows <= 0:
                continue
            all_ids = req.all_ids
            targets = torch.tensor(all_ids[lo + 1:lo + 1 + n_rows], dtype=torch.int64, device=self.device)
            chosen, vals, idx = prompt_logprobs(logits[first:first + n_rows], targets,
                                                req.top_logprobs_num)
            chosen_l = chosen.tolist()
            top = ([list(zip(i_, v_, strict=True)) for i_, v_ in zip(idx.tolist(), vals.tolist(), strict=True)]
                   if vals is not None else [[] for _ in chosen_l])
            res.prompt_logprobs[req.rid] = [(lo + 1 + j, chosen_l[j], top[j]) for j in range(n_rows)]

    def sampling_tensors(self, reqs: list[Request]) -> SamplingTensors:
        v = self.vocab_size
        ps = [r.params for r in reqs]
        greedy = [p.greedy for p in ps]
        top_k = [v if p.top_k < 1 else min(p.top_k, v) for p in ps]
        floats = torch.tensor([[p.temperature for p in ps], [p.top_p for p in ps],
                               [p.min_p for p in ps]], dtype=torch.float32)
        ints = torch.tensor([top_k, [r.seed for r in reqs], [len(r.output_ids) for r in reqs],
                             [int(g) for g in greedy]], dtype=torch.int64)
        floats, ints = self.to_device(floats), self.to_device(ints)
        t = SamplingTensors(
            temperature=floats[0], top_p=floats[1], min_p=floats[2], top_k=ints[0], seed=ints[1],
            step=ints[2], greedy=ints[3].bool(), all_greedy=all(greedy),
            need_top_filter=any(k < v or p.top_p < 1 or p.min_p > 0 for k, p in zip(top_k, ps, strict=True)),
            logprobs=any(r.return_logprob for r in reqs),
            top_logprobs=max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0))
        b = len(reqs)
        if any(p.repetition_penalty != 1.0 for p in ps):
            t.seen_mask = self._scatter(b, [r.all_ids for r in reqs], torch.bool)
            t.repetition_penalty = self.to_device(torch.tensor([p.repetition_penalty for p in ps]))
        if any(p.frequency_penalty or p.presence_penalty for p in ps):
            t.output_counts = self._scatter(b, [r.output_ids for r in reqs], torch.float32)
            t.frequency_penalty = self.to_device(torch.tensor([p.frequency_penalty for p in ps]))
            t.presence_penalty = self.to_device(torch.tensor([p.presence_penalty for p in ps]))
        blocked = [(i, self._stop_ids(r)) for i, r in enumerate(reqs)
                   if len(r.output_ids) < r.params.min_new_tokens]
        if any(ids for _, ids in blocked):
            mask = torch.zeros((b, v), dtype=torch.bool)
            for i, ids in blocked:
                mask[i, [x for x in ids if x < v]] = True
            t.stop_mask = self.to_device(mask)
        if any(r.grammar is not None for r in reqs):
            t.grammar_bitmask = self.to_device(self.grammar.bitmask([r.grammar for r in reqs]))
        return t

    @staticmethod
    def _plain_greedy(r: Request) -> bool:
        p = r.params
        return (p.greedy and not r.return_logprob and r.grammar is None and not p.has_penalties
                and len(r.output_ids) >= p.min_new_tokens)

    def _scatter(self, b: int, rows: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        """[b, V] on the device: counts (float) or presence (bool) of each row's token ids,
        built from one host->device copy of (row, id) pairs."""
        pairs = torch.tensor([[i, x] for i, ids in enumerate(rows) for x in ids] or [[0, 0]],
                             dtype=torch.int64)
        pairs = self.to_device(pairs)
        out = torch.zeros((b, self.vocab_size), dtype=torch.float32, device=self.device)
        ones = torch.ones(pairs.shape[0], device=self.device)
        if not any(rows):
            ones.zero_()
        out.index_put_((pairs[:, 0], pairs[:, 1]), ones, accumulate=True)
        return out > 0 if dtype == torch.bool else out

    @staticmethod
    def _stop_ids(r: Request) -> list[int]:
        ids = list(r.params.stop_token_ids)
        if not r.params.ignore_eos:
            ids.extend(r.eos_ids)
        return ids
