"""Quantized CPU linear methods.

- ``GGUFLinearMethod`` (quantization key ``"gguf"``): serves a GGUF file's Q4_0 / Q4_1 / Q8_0
  blocks directly. With the native kernels (``infer_cpu.kernels``, float32 models) the blocks are
  read as they are in the file (Q4_0 rewritten as Q4_1) and every product, the LM head's too
  (Q8_0 blocks of the embedding), runs ``kernels.fgemm``, with per-row arithmetic that does not
  depend on how many rows share the call. So prefill, extends after a cache hit, chunks and
  decode batches of any size give every row the same bits, and the activation precision is chosen
  per model (``INFER_CPU_ACTIVATIONS``), never per batch:
  ``int16`` (the default): each activation row quantized per 32-block to int16 codes (scale
  amax / 32767), exact integer block dot products (AVX-512 VNNI ``vpdpwssd`` where the CPU has
  it, else ``vpmaddwd``), one float chain per output over the blocks; perplexity and greedy
  answers of the float32 path (KL to the float32 reference ~1e-7), about twice as fast at batch
  1 and 1.5-2x at batch 32 and in prefill.
  ``float32``: float32 activations against the blocks dequantized exactly (the reference's
  arithmetic).
  ``int8``: llama.cpp's Q8 scheme (scale amax / 127), the fastest at large batches, with
  perplexity within 1 % of the float32 reference but distributions further from it (KL and top-1
  agreement in ``benchmarks/cpu_notes.md``), so it is opt-in. Without
  the native kernels (no C compiler, or a bf16/fp16 model) Q4 blocks become torch's int4
  group-32 weights (exact) and Q8_0 per-row int8 (requantized), LM head per-row int8. Other block
  types, and unquantized tensors, stay dense in the model dtype.
- ``Int8WeightOnlyLinearMethod``: per-row symmetric int8 weights, activations unquantized.

The torch fallbacks keep the activations in ``compute_dtype`` (bf16: the fast path of torch's CPU
kernels) and return outputs in the caller's dtype.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from infer.core.ops.linear import LinearMethod
from torch import nn

from infer_cpu import kernels
from infer_cpu.quant.packing import (
    ACTIVATION_FLAGS,
    INT4_TYPES,
    INT8_TYPES,
    PackedInt4,
    QWeight,
    gguf_int4_codes,
    gguf_q8_0_values,
    gguf_qweight,
    int4_matmul,
    int8_matmul,
    pack_int4,
    quantize_int8_rows,
    quantize_q8_blocks,
)

COMPUTE_DTYPE = torch.bfloat16
ACTIVATIONS_ENV = "INFER_CPU_ACTIVATIONS"  # the native GEMMs' activation precision
DEFAULT_ACTIVATIONS = "int16"  # near float32 quality on the integer units (cpu_notes.md)


def activation_precision() -> str:
    """``INFER_CPU_ACTIVATIONS``: the activation precision of the native block GEMMs (layers and
    LM head): ``float32``, ``int16`` or ``int8``; unset or empty: ``DEFAULT_ACTIVATIONS``.
    Anything else is an error, not a silent default."""
    value = os.environ.get(ACTIVATIONS_ENV, "").strip().lower() or DEFAULT_ACTIVATIONS
    if value not in ACTIVATION_FLAGS:
        raise ValueError(f"{ACTIVATIONS_ENV}={value!r}: expected one of "
                         f"{', '.join(repr(v) for v in ACTIVATION_FLAGS)} (the default: "
                         f"{DEFAULT_ACTIVATIONS!r})")
    return value


def refuse_nondeterministic(what: str) -> None:
    """``--enable-deterministic-inference`` with a layer the batch-invariant kernels do not serve
    is an error at load, never a silent fallback."""
    raise ValueError(
        f"--enable-deterministic-inference: {what} would not be batch invariant on the CPU. Only "
        f"the native path is: a GGUF model with Q4_0/Q4_1/Q8_0 linear weights (the default "
        f"--dtype auto, with a C compiler for the native kernels; every {ACTIVATIONS_ENV} "
        f"precision is invariant) and a float32 KV cache; serve such a model or drop the flag")


def _drop_dense(layer: nn.Module) -> None:
    """Free the dequantised weight once a packed copy exists (no code path reads it after)."""
    layer.weight = None


def _flat(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


class GGUFLinearMethod(LinearMethod):
    """Serves GGUF quantized blocks directly; see the module doc for the mapping."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        qtype = getattr(layer, "gguf_qtype", None)
        raw = getattr(layer, "gguf_raw", None)
        layer.quant_kind = "dense"
        if qtype is not None and raw is not None:
            rows = layer.weight.shape[0]
            if qtype in INT4_TYPES | INT8_TYPES and self._native():
                layer.qweight = self._activations(gguf_qweight(raw, qtype, rows))
                layer.quant_kind = "native"
            elif qtype in INT4_TYPES:
                layer.int4 = pack_int4(gguf_int4_codes(raw, qtype, rows), COMPUTE_DTYPE)
                layer.quant_kind = "int4"
            elif qtype in INT8_TYPES:
                q, scale = quantize_int8_rows(gguf_q8_0_values(raw, rows))
                layer.int8_q, layer.int8_scale = q, scale.to(COMPUTE_DTYPE)
                layer.quant_kind = "int8"
        if self.config.deterministic and layer.quant_kind != "native":
            refuse_nondeterministic(f"a {layer.quant_kind} linear layer (GGUF type "
                                    f"{getattr(qtype, 'name', qtype)}, {self.config.dtype})")
        if layer.quant_kind != "dense":
            _drop_dense(layer)
        layer.gguf_raw = None  # the raw blocks are not needed after packing

    def process_lm_head(self, lm_head: nn.Module) -> None:
        """The LM head (often tied to the embedding, whose dense weight stays for lookups) runs on
        Q8 blocks of 32 with the native kernels, else as per-row int8: about a quarter of the
        float32 bytes read per decode step."""
        if self._native():
            qw = self._activations(quantize_q8_blocks(lm_head.weight.data))
            lm_head.qweight = qw

            def native(hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
                y = kernels.fgemm(hidden.reshape(-1, hidden.shape[-1]), qw)
                if y is None and self.config.deterministic:
                    refuse_nondeterministic(f"a {hidden.dtype} input to the LM head")
                return y if y is not None else F.linear(hidden, qw.dequantize().to(hidden.dtype))

            lm_head.quant_apply = native
            return
        if self.config.deterministic:
            refuse_nondeterministic(f"the per-row int8 LM head ({self.config.dtype})")
        q, scale = quantize_int8_rows(lm_head.weight.data)
        scale = scale.to(COMPUTE_DTYPE)
        lm_head.int8_q, lm_head.int8_scale = q, scale

        def apply(hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
            return int8_matmul(hidden, q, scale)

        lm_head.quant_apply = apply

    @staticmethod
    def _activations(qw: QWeight) -> QWeight:
        return kernels.with_tiles(qw.with_activations(activation_precision()))

    def _native(self) -> bool:
        """Native block kernels: float32 activations, and the library built on this machine."""
        return self.config.dtype == torch.float32 and kernels.load() is not None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        kind = layer.quant_kind
        if kind == "dense":
            return F.linear(x, layer.weight, layer.bias)
        x2, lead = _flat(x)
        if kind == "native":
            y = kernels.fgemm(x2, layer.qweight, layer.bias)
            if y is None:  # an input the kernel does not take (not float32 rows): dequantise
                if self.config.deterministic:
                    refuse_nondeterministic(f"a {x.dtype} input of {tuple(x.shape)} to a GGUF layer")
                return F.linear(x, layer.qweight.dequantize().to(x.dtype), layer.bias)
            return y.reshape(*lead, y.shape[-1])
        if kind == "int4":
            packed: PackedInt4 = layer.int4
            y = int4_matmul(x2, packed)
        else:
            y = int8_matmul(x2, layer.int8_q, layer.int8_scale)
        if layer.bias is not None:
            y = y + layer.bias
        return y.reshape(*lead, y.shape[-1])


class Int8WeightOnlyLinearMethod(LinearMethod):
    """Per-output-row symmetric int8 weights; activations stay in floating point."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.config.deterministic:
            refuse_nondeterministic("--torchao-config int8wo (torch's int8 weight-only matmul)")
        q, scale = quantize_int8_rows(layer.weight.data)
        layer.int8_q, layer.int8_scale = q, scale.to(COMPUTE_DTYPE)
        _drop_dense(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        x2, lead = _flat(x)
        y = int8_matmul(x2, layer.int8_q, layer.int8_scale)
        if layer.bias is not None:
            y = y + layer.bias
        return y.reshape(*lead, y.shape[-1])
