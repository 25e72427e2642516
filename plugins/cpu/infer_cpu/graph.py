"""``native_decode``: the CPU plugin's graph runner.

A CUDA graph removes the launch cost of a decode step's many small kernels; on the CPU the same
cost is Python's: one decode step of a 30-layer model makes about 300 op calls from Python, each
a few microseconds of interpreter and ctypes work around a kernel that often takes less. This
runner "captures" the decoder stack once: it checks that every layer runs the plugin's native
kernels (GGUF-block linear layers, native RMSNorm / rotary / paged attention, a float32, fp16 (a GGUF
file's default on the CPU) or bf16 (``--kv-cache-dtype bf16``) KV cache)
and records each layer's weight and cache pointers in a C array. A decode step is then one
native call for all layers (``infer_decode_layers``, the same kernels the per-op path calls, so
both paths give identical numbers), plus the embedding lookup, final norm and LM head in torch.
Prefill, extend and mixed batches take the same call: each row is a query with its
sequence's block-table row and the number of keys it sees, as the per-op attention runs them
(``INFER_CPU_GGUF_NATIVE_PREFILL=0`` leaves them to the per-op path). A 128-token prompt of the
default model: 140-149 -> 100-123 ms on two threads.

Tensor parallelism: each rank captures its shard (its heads, KV heads and intermediate
columns) and the native call sums the attention output and MLP down projections across ranks
itself, where the per-op path calls the communicator: with the shared-memory communicator (every
rank on this host) through its C all-reduce (``kernels/infer_cpu_comm.c``), so the step never
returns to Python; with any other communicator (ranks on several hosts: gloo) through a ctypes
callback into its ``all_reduce``. The vocabulary-parallel embedding's all-reduce and the LM
head's all-gather happen in torch before and after the call, as on the per-op path. A rank whose
peer died gets an error from the call (``RuntimeError``), never a hang.

A model it cannot run (another architecture or layer type, dense weights, a non-native
attention backend, an fp8 KV cache, pipeline parallelism) is left to the per-op path, and
``reason`` says why. A bf16 model (bf16 weights and cache) runs the bf16 stack of
``infer_cpu.graph_bf16`` instead (bf16 weights on the native bf16 GEMM; one rank only), which
also takes prefill / extend batches: every step of a bf16 model is one native call
(``INFER_CPU_BF16_NATIVE_PREFILL=0`` leaves prefills to the per-op path).
``--disable-cuda-graph`` / ``--enforce-eager`` turn the runner off.
There is no batch-size padding: the call takes any decode batch. The call runs each layer as jobs
on the library's work pool (``kernels/infer_cpu_pool.h``, as the bf16 stack does; the per-op
GEMM, norm and attention calls too): the calling thread never waits for a helper that another
process keeps off its core, and a thread preempted in the middle of a unit swaps cores with the
thread waiting for it. On one rank the step runs on 1 thread or on all of them per batch-size
class, whichever measured faster (``kb.ThreadChoice``); ``INFER_CPU_DECODE_THREADS`` fixes the
count. The kernels' results do not depend on it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from typing import Any

import torch
from infer.core.ops.graph import GraphRunner

from infer_cpu import hugepages, kernels
from infer_cpu.graph_bf16 import BF16DecodeStack, Unsupported, embed_input
from infer_cpu.ops.attention import query_rows

log = logging.getLogger(__name__)


class NativeDecodeGraph(GraphRunner):
    def __init__(self, model_runner: Any, graph: Any) -> None:  # graph: GraphConfig (unused)
        self.mr = model_runner
        self.ok = False
        self.reason = "not captured"
        self._keep: list[Any] = []
        self._bf16: BF16DecodeStack | None = None
        self._ar_fn: int | None = None  # the all-reduce the native step calls (tp > 1)
        self._ar_state: int | None = None
        self._ar_errors: list[BaseException] = []  # raised by the callback route
        self._comm: Any = None
        self.all_reduce_route = "none (one rank)"
        self.kv16 = 0
        self.extend = False  # prefill / extend batches in the native call too

    # -- capture -------------------------------------------------------------------------------
    def capture(self) -> None:
        try:
            self._capture()
            self.ok, self.reason = True, "captured"
        except (_Unsupported, Unsupported) as e:
            self.ok, self.reason = False, str(e)
            log.info("native decode graph not used: %s", e)

    def _capture(self) -> None:
        from infer.core.model.layers.mlp import GatedMLP
        from infer.core.model.models.llama import DecoderLayer

        lib = kernels.load()
        if lib is None:
            raise _Unsupported(kernels.status().detail)
        mr = self.mr
        model = mr.model
        ctx = mr.loaded.ctx
        tp = getattr(ctx, "tp_size", 1)
        if getattr(ctx, "pipeline", None) is not None:
            raise _Unsupported("pipeline parallelism (a stage sends and receives between layers)")
        if ctx.attention_backend_name != "torch_native":
            raise _Unsupported(f"attention backend {ctx.attention_backend_name!r}")
        kv_dtype = mr.kv_cache.k[0].dtype
        if kv_dtype == torch.bfloat16 and ctx.attn_backend.config.dtype != torch.float32:
            if tp != 1:
                raise _Unsupported("tensor parallelism with a bf16 model (the bf16 stack runs "
                                   "one rank)")
            self._bf16 = BF16DecodeStack(mr)
            return
        if kv_dtype not in kernels.KV_CODES:
            raise _Unsupported(f"KV cache dtype {kv_dtype}")
        self.kv16 = kernels.KV_CODES[kv_dtype]  # a float32 model's float32, bf16 or fp16 cache
        layers = list(getattr(getattr(model, "model", None), "layers", []))
        if not layers:
            raise _Unsupported("no decoder layers found")
        rotary = getattr(model, "rotary", None)
        if rotary is None or rotary.cos_sin.dtype != torch.float32:
            raise _Unsupported("no float32 rotary table")
        table = (kernels.Layer * len(layers))()
        eps = None
        for i, layer in enumerate(layers):
            if type(layer) is not DecoderLayer or type(layer.mlp) is not GatedMLP:
                raise _Unsupported(f"layer {i} is {type(layer).__name__}, not a dense Llama layer")
            attn = layer.self_attn
            if attn.q_norm is not None:
                raise _Unsupported("per-head q/k norm")
            if attn.rotary is not rotary:
                raise _Unsupported("per-layer rotary")
            mods = [attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
            for m in mods:
                if getattr(m, "quant_kind", None) != "native":
                    raise _Unsupported(f"layer {i} has a {getattr(m, 'quant_kind', 'dense')} "
                                       f"linear layer (only GGUF Q4/Q8 blocks run natively)")
            if any(m.bias is not None for m in mods[1:]):
                raise _Unsupported("bias on o/gate/up/down projections")
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            if any(n.weight.dtype != torch.float32 for n in norms):
                raise _Unsupported("non-float32 norms")
            if eps is None:
                eps = norms[0].eps
            if any(n.eps != eps for n in norms):
                raise _Unsupported("different norm eps per layer")
            qkv_bias = attn.qkv_proj.bias
            if qkv_bias is not None and (qkv_bias.dtype != torch.float32
                                         or not qkv_bias.is_contiguous()):
                raise _Unsupported("qkv bias not float32")
            k_cache, v_cache = mr.kv_cache.k[i], mr.kv_cache.v[i]
            if hugepages.enabled():  # the blocks that 1- and 2-row steps stream (the tiles are
                for m in mods:       # allocated there already)
                    m.qweight.blocks = hugepages.rehome(m.qweight.blocks)
            table[i] = kernels.Layer(
                norms[0].weight.data_ptr(), norms[1].weight.data_ptr(),
                *(m.qweight.blocks.data_ptr() for m in mods),
                qkv_bias.data_ptr() if qkv_bias is not None else None,
                *(m.qweight.kind for m in mods), k_cache.data_ptr(), v_cache.data_ptr(),
                *(_ptr(m.qweight.tiles) for m in mods))
            self._keep += [norms, mods, k_cache, v_cache]
        head = getattr(model.lm_head, "qweight", None)
        if head is not None and hugepages.enabled():  # the LM head, run after the call
            head.blocks = hugepages.rehome(head.blocks)
        self.q8_screen = self._q8_screen(model, head)
        a0 = layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = a0.num_heads, a0.num_kv_heads, a0.head_dim
        self.hidden = layers[0].mlp.down_proj.out_features
        self.inter = layers[0].mlp.down_proj.in_features
        self.eps = float(eps)
        self.rotary = rotary
        self.scale = ctx.attn_backend.config.scale
        self.table, self.n_layers = table, len(layers)
        self._fn = lib.infer_decode_layers
        self._model = model
        if tp != 1:
            self._wire_all_reduce(ctx.comm)
        else:  # one rank: 1 or all threads per batch-size class, whichever steps faster
            from infer_cpu.kernels import bf16 as kb

            fixed = int(os.environ.get("INFER_CPU_DECODE_THREADS", "0"))
            self.threads = kb.ThreadChoice(torch.get_num_threads(), fixed)
            self.extend_threads = kb.ThreadChoice(torch.get_num_threads(), fixed, max_first=True)
        self.extend = os.environ.get("INFER_CPU_GGUF_NATIVE_PREFILL", "1") != "0"

    @staticmethod
    def _q8_screen(model: Any, head: Any) -> kernels.Q8ScreenData | None:
        """The greedy steps' screen of the LM head (``kernels.q8_head_greedy``: argmax ids,
        exactly, with exact logits only for the columns it cannot rule out) where the head is the
        plugin's Q8_0 GEMM with int16 activations on one rank, the model's logits are the base
        ``compute_logits`` (final norm, then the head), and the library screens on AMX tiles.
        ``INFER_CPU_GREEDY_SCREEN=0`` turns it off."""
        from infer.core.model.models.base import DecoderOnlyLM

        from infer_cpu.quant.packing import KIND_I16

        if (head is None or head.kind != 8 | KIND_I16 or getattr(model.lm_head, "tp_size", 1) != 1
                or head.in_features % 64 or head.in_features > 2048
                or type(model).compute_logits is not DecoderOnlyLM.compute_logits
                or os.environ.get("INFER_CPU_GREEDY_SCREEN", "1") == "0"
                or not kernels.q8_screen_available()):
            return None
        return kernels.Q8ScreenData(head)

    def _wire_all_reduce(self, comm: Any) -> None:
        """The communicator's C all-reduce if it has one (the shared-memory segment), else a
        callback into its ``all_reduce``. Every rank gets here at the same point of capture:
        the first ``native_all_reduce()`` sets the segment up, a collective."""
        self._comm = comm
        native = getattr(comm, "native_all_reduce", None)
        handle = native() if native is not None else None
        if handle is not None:
            self._ar_fn, self._ar_state = handle
            self.all_reduce_route = "native (shared memory, in C)"
            return
        errors = self._ar_errors

        def all_reduce(state: int | None, ptr: int, n: int) -> int:
            try:
                x = torch.frombuffer((ctypes.c_float * n).from_address(ptr), dtype=torch.float32)
                y = comm.all_reduce(x)
                if y.data_ptr() != x.data_ptr():
                    x.copy_(y)
                return 0
            except BaseException as e:  # noqa: BLE001 (an exception cannot cross into C)
                errors.append(e)
                return 1

        callback = _ALL_REDUCE_FN(all_reduce)
        self._keep.append(callback)
        self._ar_fn = ctypes.cast(callback, ctypes.c_void_p).value
        self.all_reduce_route = f"callback into {type(comm).__name__}.all_reduce"

    # -- replay --------------------------------------------------------------------------------
    def can_run(self, batch: Any) -> bool:
        if not self.ok:
            return False
        if batch.attn.is_decode_only:
            return True
        return self._bf16.extend if self._bf16 is not None else self.extend

    def run(self, batch: Any) -> torch.Tensor:
        """Decode step: embedding (torch) -> all layers (one native call) -> norm + LM head; a
        bf16 stack also takes prefill / extend batches (``BF16DecodeStack.run_extend``).
        Prefill / extend rows of the GGUF stack: every row is a query of its own, with its
        sequence's block-table row and the keys it sees (its position + 1), the attention
        backend's per-row form (``query_rows``): the call writes all rows' keys and values
        first, then attends each row, as the per-op path does with the same kernel."""
        if self._bf16 is not None:
            if not batch.attn.is_decode_only:
                return self._bf16.run_extend(batch)
            return self._bf16.run(batch)
        model, meta = self._model, batch.attn
        h = embed_input(model, batch.input_ids)  # [B, hidden]
        pos = batch.positions.contiguous()
        slots = meta.slot_mapping.contiguous()
        decode = meta.is_decode_only
        bt, seq_lens = query_rows(meta)
        seq_lens = seq_lens.contiguous()
        if (pos.dtype != torch.int64 or slots.dtype != torch.int64 or bt.dtype != torch.int32
                or bt.stride(1) != 1 or seq_lens.dtype != torch.int32):
            raise TypeError("decode metadata dtypes differ from what the native graph expects")
        lib = kernels._lib()  # sizes the work pool to torch's thread count
        # one rank: the measured choice (tp: every thread)
        choice = getattr(self, "threads" if decode else "extend_threads", None)
        threads = choice.pick(h.shape[0]) if choice is not None else torch.get_num_threads()
        if threads != kernels._threads[0]:
            lib.infer_set_threads(threads)
            kernels._threads[0] = threads  # the next per-op call sets torch's count again
        t0 = time.perf_counter()
        rc = self._fn(self.table, self.n_layers, h.data_ptr(), h.shape[0], self.hidden,
                      self.heads, self.kv_heads, self.head_dim, self.inter, self.eps,
                      pos.data_ptr(), self.rotary.cos_sin.data_ptr(), self.rotary.rotary_dim,
                      slots.data_ptr(), bt.data_ptr(), bt.stride(0), seq_lens.data_ptr(),
                      meta.page_size, self.scale, self._ar_fn, self._ar_state, self.kv16)
        if rc:
            if self._ar_errors:
                raise self._ar_errors.pop()
            raise RuntimeError(self._comm.native_error())
        if choice is not None:
            choice.record(h.shape[0], threads, time.perf_counter() - t0)
        if self.q8_screen is not None and getattr(batch, "greedy_ids", False):
            # greedy rows: argmax ids of the head's exact logits, screened (ModelRunner's
            # ``greedy_ids`` contract)
            ids = kernels.q8_head_greedy(
                model.model.norm(h.index_select(0, batch.logits_indices)).contiguous(), self.q8_screen)
            if ids is not None:
                return ids
        return model.compute_logits(h, batch)


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


_ALL_REDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _Unsupported(Exception):
    pass
