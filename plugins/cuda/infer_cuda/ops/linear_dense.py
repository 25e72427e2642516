"""The default (unquantized) linear method on CUDA: cuBLAS (F.linear), except small-M calls
(decode, M <= 8 rows) of a shape where a Triton GEMV was timed faster (``kernels/gemv.py``).

The choice for each weight shape and M bucket (1, 2, 4, 8) is timed when the weights load
(``prewarm_small_m``), so no forward waits for it. Under torch.compile the small-M call is the
opaque custom op ``infer_cuda::gemv``, which looks the choice up when it runs: Dynamo traces with
fake tensors, and the compiled graph has no break either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infer.core.config.flags import ConfigError
from infer.core.ops.linear import LinearConfig
from infer.core.ops.reference.linear import DenseLinearMethod
from torch import nn

from infer_cuda.kernels import gemv as gemv_kernel
from infer_cuda.kernels.common import interpreting

SMALL_M_DTYPES = (torch.bfloat16, torch.float16)


def small_m_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] -> [M, N] by whichever of cuBLAS and the Triton GEMV ``pick`` chose for the shape."""
    choice = gemv_kernel.pick(x.shape[0], weight.shape[0], x.shape[1], x.dtype, x.device, weight)
    if choice == "cublas":
        return F.linear(x, weight, bias)
    return gemv_kernel.gemv(x, weight, bias, choice)


@torch.library.custom_op("infer_cuda::gemv", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return small_m_linear(x, weight, bias)


@gemv_op.register_fake
def _gemv_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def small_m_rows(x: torch.Tensor) -> bool:
    """x [M, K] is a GEMV candidate: 1..MAX_M rows on CUDA (or Triton's interpreter), GEMV on."""
    return (0 < x.shape[0] <= gemv_kernel.MAX_M and (x.is_cuda or interpreting())
            and gemv_kernel.mode() != "off")


def small_m_eligible(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """x [M, K] may take the GEMV: small M of bf16/fp16, the weight in the same dtype."""
    return small_m_rows(x) and x.dtype in SMALL_M_DTYPES and weight.dtype == x.dtype


def prewarm_small_m(N: int, K: int, dtype: torch.dtype, device: torch.device,
                    fp8_baseline: gemv_kernel.Baseline | None = None,
                    fp8_dtype: torch.dtype | None = None) -> None:
    """Make the GEMV-or-cuBLAS choice for a weight shape at every M bucket now, at load time,
    rather than in the first forward that meets it (a request served eagerly, without CUDA
    graphs, would wait for the timing). Fresh random weights are timed: the layer's may not be
    filled yet. Nothing to do off CUDA or with INFER_CUDA_GEMV=off."""
    if torch.device(device).type != "cuda" or interpreting() or gemv_kernel.mode() == "off":
        return
    if dtype not in SMALL_M_DTYPES and fp8_dtype is None:
        return
    weight = scale = None
    if fp8_dtype is not None:
        weight = torch.randn(N, K, device=device).to(fp8_dtype)
        scale = torch.rand(N, device=device) + 0.5
    m = 1
    while m <= gemv_kernel.MAX_M:
        gemv_kernel.pick(m, N, K, dtype, device, weight, scale, fp8_baseline)
        m *= 2


class CudaDenseLinearMethod(DenseLinearMethod):
    def __init__(self, config: LinearConfig) -> None:
        super().__init__(config)
        try:  # a bad INFER_CUDA_GEMV is a start-up error, not one in the first forward
            gemv_kernel.mode()
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        w = layer.weight
        prewarm_small_m(w.shape[0], w.shape[1], w.dtype, w.device)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        x2 = x.reshape(-1, x.shape[-1])  # [M, in]
        if not small_m_eligible(x2, layer.weight):
            return F.linear(x, layer.weight, layer.bias)
        if torch.compiler.is_compiling():
            y = torch.ops.infer_cuda.gemv(x2, layer.weight, layer.bias)
        else:  # eager: skip the dispatcher's cost per call
            y = small_m_linear(x2, layer.weight, layer.bias)
        return y.view(*x.shape[:-1], y.shape[-1])
