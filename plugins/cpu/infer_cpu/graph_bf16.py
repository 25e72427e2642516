"""The bf16 stack of ``native_decode`` (``infer_cpu.graph``): bf16 models with a bf16 KV cache,
every decoder layer in one native call: ``infer_bf16_decode_layers`` for decode steps,
``infer_bf16_forward_layers`` for batches with prefill or extend rows (``run_extend``: the
projections of all rows, then causal attention over each sequence's paged keys -- the per-op
path's prefill attention kernel -- then the MLP; mixed decode rows are sequences of one row).
``INFER_CPU_BF16_NATIVE_PREFILL=0`` leaves those batches to the per-op path.

Capture checks that each layer is a dense Llama-family layer whose four projections were packed
by the CPU plugin's bf16 linear method (``infer_cpu.ops.linear_native``), and records float32
copies of the norm weights and qkv bias with the packed weights and cache pointers in a C array.
The step keeps the residual stream in float32 and rounds only the GEMM inputs to bf16 (the
per-op path keeps the residual in bf16 too), so the two paths agree closely, not bit for bit;
both are tested against transformers. The final norm and the LM head run in the same native call
(float32 logits, as ``compute_logits`` gives). A step whose rows are all plain greedy samples
(``ForwardBatch.greedy_ids``) gets their argmax ids from the call instead: the head is screened
with an int8 copy and a rigorous error bound, and only the columns that can hold the maximum are
computed exactly (the C file's "greedy LM head"; the same ids as argmax of the logits; the
bf16 engine's output rate 1.04x at 32 running requests). ``INFER_CPU_GREEDY_SCREEN=0`` turns
it off.

Threads: the call runs each layer as four jobs of the kernels' work pool (attention by KV group
and rows; o projection, gate/up with SiLU, down projection by columns), whose caller waits only
for units a helper thread has taken; still, a helper descheduled in the middle of a unit holds
the job up, so ``kb.ThreadChoice`` picks the thread count per batch-size class from measured step
times (one step in 16 tries the other count, so a change of load is followed);
``INFER_CPU_BF16_DECODE_THREADS`` fixes it instead.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import torch
from infer.core.model.layers.embedding import VocabEmbedding

from infer_cpu import kernels
from infer_cpu.kernels import bf16 as kb


def embed_input(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """The native graphs' input rows: float32 [T, hidden] embeddings of ``input_ids``. One rank's
    plain lookup goes through ``kernels.embed_rows`` (no OpenMP region: torch's lookup and float()
    of a 128-token prefill waited 16 ms for a busy core's thread); a vocabulary-parallel one, or
    anything the kernel does not read, through the module."""
    emb = model.model.embed_tokens
    if type(emb) is VocabEmbedding and emb.tp_size == 1:
        h = kernels.embed_rows(emb.weight, input_ids)
        if h is not None:
            return h
    return emb(input_ids).float().contiguous()


class Unsupported(Exception):
    """The model does not fit the bf16 decode stack; the message says why."""


class BF16DecodeStack:
    def __init__(self, mr: Any) -> None:
        from infer.core.model.layers.mlp import GatedMLP
        from infer.core.model.models.llama import DecoderLayer

        lib = kb.load()
        if lib is None:
            raise Unsupported(kb.detail())
        model, ctx, cache = mr.model, mr.loaded.ctx, mr.kv_cache
        if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in cache.k + cache.v):
            raise Unsupported("the bf16 decode stack needs a contiguous bf16 KV cache")
        layers = list(getattr(getattr(model, "model", None), "layers", []))
        rotary = getattr(model, "rotary", None)
        if not layers or rotary is None:
            raise Unsupported("no decoder layers or rotary table found")
        if rotary.cos_sin.dtype != torch.float32 or not rotary.cos_sin.is_contiguous():
            raise Unsupported("no contiguous float32 rotary table")
        if getattr(model.lm_head, "bf16_packed", None) is None:
            raise Unsupported("the LM head is not on the native bf16 GEMM")
        self._keep: list[Any] = []
        table = (kb.Layer * len(layers))()
        eps = None
        for i, layer in enumerate(layers):
            if type(layer) is not DecoderLayer or type(layer.mlp) is not GatedMLP:
                raise Unsupported(f"layer {i} is {type(layer).__name__}, not a dense Llama layer")
            attn = layer.self_attn
            if attn.q_norm is not None or attn.rotary is not rotary:
                raise Unsupported("per-head q/k norm or a per-layer rotary table")
            projs = [attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]
            packed = [getattr(m, "bf16_packed", None) for m in projs]
            if any(p is None for p in packed):
                kind = getattr(projs[packed.index(None)], "quant_kind", "dense")
                raise Unsupported(f"layer {i} has a {kind} linear layer (the bf16 stack runs "
                                  "bf16 weights packed for the native bf16 GEMM)")
            if any(m.bias is not None for m in projs[1:]):
                raise Unsupported("bias on o/gate/up/down projections")
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            eps = norms[0].eps if eps is None else eps
            if any(n.eps != eps for n in norms):
                raise Unsupported("different norm eps per layer")
            w32 = [n.weight.detach().float().contiguous() for n in norms]  # [hidden] each
            bqkv = attn.qkv_proj.bias_f32
            table[i] = kb.Layer(w32[0].data_ptr(), w32[1].data_ptr(),
                                *(p.data.data_ptr() for p in packed),
                                bqkv.data_ptr() if bqkv is not None else None,
                                cache.k[i].data_ptr(), cache.v[i].data_ptr())
            self._keep += [w32, packed, bqkv, cache.k[i], cache.v[i]]
        self._rehome_weights(table, layers, model)
        a0 = layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = a0.num_heads, a0.num_kv_heads, a0.head_dim
        if self.heads % self.kv_heads:
            raise Unsupported(f"{self.heads} query heads do not group over {self.kv_heads} KV heads")
        self.hidden = layers[0].mlp.down_proj.out_features
        self.inter = layers[0].mlp.down_proj.in_features
        self.eps, self.rotary, self.scale = float(eps), rotary, ctx.attn_backend.config.scale
        self.table, self.n_layers, self.model = table, len(layers), model
        norm = getattr(model.model, "norm", None)
        if norm is None or getattr(norm, "weight", None) is None:
            raise Unsupported("no final norm found")
        if getattr(model.lm_head, "tp_size", 1) != 1:
            raise Unsupported("a vocabulary-parallel LM head")
        self.final_norm = norm.weight.detach().float().contiguous()
        self.final_eps = float(norm.eps)
        self.lm_head = model.lm_head.bf16_packed
        # greedy steps: the head's int8 screen (argmax ids, exactly; the C file's "greedy LM
        # head") where the library has it (AVX-512 VNNI; with AMX, whose tiles sum the full
        # head, its exact candidates sum on tiles too)
        self.screen: kb.ScreenData | None = None
        if (lib.infer_bf16_screen_ok() and self.hidden % 4 == 0
                and os.environ.get("INFER_CPU_GREEDY_SCREEN", "1") != "0"):
            self.screen = kb.ScreenData(model.lm_head.weight)
        self.threads = kb.ThreadChoice(torch.get_num_threads(),
                                    int(os.environ.get("INFER_CPU_BF16_DECODE_THREADS", "0")))
        self._fn = lib.infer_bf16_decode_layers
        self._fwd = lib.infer_bf16_forward_layers
        self.extend = os.environ.get("INFER_CPU_BF16_NATIVE_PREFILL", "1") != "0"
        self.extend_threads = kb.ThreadChoice(
            torch.get_num_threads(), int(os.environ.get("INFER_CPU_BF16_DECODE_THREADS", "0")),
            max_first=True)

    @staticmethod
    def _rehome_weights(table: Any, layers: list[Any], model: Any) -> None:
        """Every layer's packed projections and the packed LM head copied onto transparent
        huge pages (``infer_cpu.hugepages``); the modules and the table point at the copies.
        Nothing happens where huge pages are off."""
        from infer_cpu import hugepages

        if not hugepages.enabled():
            return
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            for name, m in zip(("wqkv", "wo", "wgu", "wdown"),
                               (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj),
                               strict=True):
                m.bf16_packed.data = hugepages.rehome(m.bf16_packed.data)
                setattr(table[i], name, m.bf16_packed.data.data_ptr())
        model.lm_head.bf16_packed.data = hugepages.rehome(model.lm_head.bf16_packed.data)

    def run(self, batch: Any) -> torch.Tensor:
        """Decode step: embedding (torch) -> all layers, final norm and LM head (one native
        call) -> float32 logits [B, vocab]."""
        meta = batch.attn
        h = embed_input(self.model, batch.input_ids)  # [B, hidden]
        pos, slots = batch.positions.contiguous(), meta.slot_mapping.contiguous()
        bt, seq_lens = meta.block_tables, meta.seq_lens.contiguous()
        if (pos.dtype != torch.int64 or slots.dtype != torch.int64 or bt.dtype != torch.int32
                or bt.stride(1) != 1 or seq_lens.dtype != torch.int32):
            raise TypeError("decode metadata dtypes differ from what the bf16 decode stack expects")
        b = h.shape[0]
        rows = batch.logits_indices
        fused = rows.shape == (b,) and torch.equal(rows.cpu(), torch.arange(b))
        ids = torch.empty(b, dtype=torch.int64) if fused and self._greedy(batch) else None
        logits = torch.empty(b, self.lm_head.out_features) if fused and ids is None else None
        threads = self.threads.pick(b)
        t0 = time.perf_counter()
        self._fn(self.table, self.n_layers, h.data_ptr(), b, self.hidden, self.heads,
                 self.kv_heads, self.head_dim, self.inter, self.eps, pos.data_ptr(),
                 self.rotary.cos_sin.data_ptr(), self.rotary.rotary_dim, slots.data_ptr(),
                 bt.data_ptr(), bt.stride(0), seq_lens.data_ptr(), meta.page_size, self.scale,
                 threads, self.final_norm.data_ptr() if fused else None, self.final_eps,
                 self.lm_head.data.data_ptr() if fused else None, self.lm_head.out_features,
                 logits.data_ptr() if logits is not None else None, *self._screen_args(ids))
        self.threads.record(b, threads, time.perf_counter() - t0)
        if ids is not None:
            return ids
        return logits if logits is not None else self.model.compute_logits(h, batch)

    def _greedy(self, batch: Any) -> bool:
        """Whether this step returns argmax ids (``batch.greedy_ids``, with the screen built)."""
        return self.screen is not None and getattr(batch, "greedy_ids", False)

    def _screen_args(self, ids: torch.Tensor | None) -> tuple[Any, Any]:
        """The native call's (screen, ids) arguments: both NULL for a logits step."""
        if ids is None:
            return None, None
        assert self.screen is not None
        return ctypes.byref(self.screen.struct), ids.data_ptr()

    def run_extend(self, batch: Any) -> torch.Tensor:
        """A batch with prefill or extend rows (mixed with decode rows or not): embedding
        (torch) -> all layers with causal attention over each sequence's keys, final norm and
        the LM head on the logit rows (one native call) -> float32 logits [N, vocab]."""
        meta = batch.attn
        h = embed_input(self.model, batch.input_ids)  # [T, hidden]
        pos, slots = batch.positions.contiguous(), meta.slot_mapping.contiguous()
        bt, seq_lens = meta.block_tables, meta.seq_lens.contiguous()
        ext = torch.tensor(meta.extend_lens_cpu, dtype=torch.int32)
        rows = batch.logits_indices.to(torch.int64).contiguous()
        if (pos.dtype != torch.int64 or slots.dtype != torch.int64 or bt.dtype != torch.int32
                or bt.stride(1) != 1 or seq_lens.dtype != torch.int32):
            raise TypeError("batch metadata dtypes differ from what the bf16 stack expects")
        t = h.shape[0]
        if int(ext.sum()) != t or ext.shape[0] != seq_lens.shape[0] or bool((seq_lens < ext).any()):
            raise ValueError("extend lengths do not match the batch's rows")
        ids = torch.empty(rows.shape[0], dtype=torch.int64) if self._greedy(batch) else None
        logits = torch.empty(rows.shape[0], self.lm_head.out_features) if ids is None else None
        threads = self.extend_threads.pick(t)
        t0 = time.perf_counter()
        self._fwd(self.table, self.n_layers, h.data_ptr(), t, self.hidden, self.heads,
                  self.kv_heads, self.head_dim, self.inter, self.eps, pos.data_ptr(),
                  self.rotary.cos_sin.data_ptr(), self.rotary.rotary_dim, slots.data_ptr(),
                  bt.data_ptr(), bt.stride(0), seq_lens.data_ptr(), ext.data_ptr(),
                  ext.shape[0], meta.page_size, self.scale, threads, self.final_norm.data_ptr(),
                  self.final_eps, self.lm_head.data.data_ptr(), self.lm_head.out_features,
                  rows.data_ptr(), rows.shape[0],
                  logits.data_ptr() if logits is not None else None, *self._screen_args(ids))
        self.extend_threads.record(t, threads, time.perf_counter() - t0)
        return ids if ids is not None else logits
