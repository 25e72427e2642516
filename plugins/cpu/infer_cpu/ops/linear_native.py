"""The CPU plugin's unquantized linear method: bf16 weights on the native bf16 GEMM.

A bf16 model's dense weights [out, in] are pair-packed once after loading
(``infer_cpu.kernels.bf16``; the dense copy is freed) and every product runs on the native
kernel (AVX-512 BF16, AVX2 or portable C, whichever this CPU was compiled for), also the LM head
(a packed copy beside the embedding it may be tied to). The activations are rounded to bf16, as
a bf16 model's are; outputs come back in the input's dtype (the LM head's in float32).

Everything else (float32 and float16 models, no C compiler, ``INFER_CPU_KERNELS=0``) is the
plain-torch reference ``DenseLinearMethod``, which the kernel is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infer.core.ops.reference.linear import DenseLinearMethod
from torch import nn

from infer_cpu.kernels import bf16 as kb


def _packable(w: torch.Tensor | None) -> bool:
    return w is not None and w.dtype == torch.bfloat16 and w.dim() == 2 and w.device.type == "cpu"


class NativeDenseLinearMethod(DenseLinearMethod):
    def _native(self) -> bool:
        return self.config.dtype == torch.bfloat16 and kb.load() is not None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.config.deterministic:  # neither the bf16 kernel nor torch's GEMM is batch invariant
            from infer_cpu.quant.methods import refuse_nondeterministic

            refuse_nondeterministic(f"a dense {self.config.dtype} linear layer")
        layer.bf16_packed = None
        if not (self._native() and _packable(layer.weight)):
            return
        layer.bf16_packed = kb.pack(layer.weight.data)
        layer.bias_f32 = layer.bias.float().contiguous() if layer.bias is not None else None
        layer.quant_kind = "bf16"
        layer.weight = None  # the packed copy is the only one read from here on

    def process_lm_head(self, lm_head: nn.Module) -> None:
        """bf16 LM head on the native kernel: hidden [N, hidden] -> float32 logits [N, vocab]."""
        if self.config.deterministic:
            from infer_cpu.quant.methods import refuse_nondeterministic

            refuse_nondeterministic(f"a dense {self.config.dtype} LM head")
        if not (self._native() and _packable(lm_head.weight)):
            return
        packed = kb.pack(lm_head.weight.data)
        lm_head.bf16_packed = packed

        def native(hidden: torch.Tensor) -> torch.Tensor:
            x = hidden.reshape(-1, hidden.shape[-1])
            y = kb.gemm(x, packed, out_dtype=torch.float32)
            if y is None:  # an input the kernel does not take: the reference on the weight
                y = F.linear(x.to(torch.bfloat16), packed.unpack()).float()
            return y.reshape(*hidden.shape[:-1], packed.out_features)

        lm_head.quant_apply = native

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        packed = getattr(layer, "bf16_packed", None)
        if packed is None:
            return super().apply(layer, x)
        x2 = x.reshape(-1, x.shape[-1])
        y = kb.gemm(x2, packed, layer.bias_f32, out_dtype=x.dtype)
        if y is None:  # an input the kernel does not take (a float16 x, say): the reference
            bias = layer.bias_f32.to(x.dtype) if layer.bias_f32 is not None else None
            return F.linear(x, packed.unpack().to(x.dtype), bias)
        return y.reshape(*x.shape[:-1], packed.out_features)
