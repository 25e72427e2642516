"""Quantized CPU linear methods against the gguf package's dequantisation and dense matmuls."""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from infer.core.ops.linear import LinearConfig
from infer_cpu.quant.methods import GGUFLinearMethod, Int8WeightOnlyLinearMethod
from infer_cpu.quant.packing import (
    Int4Codes,
    gguf_int4_codes,
    gguf_q8_0_values,
    int4_matmul,
    pack_int4,
    quantize_int4,
    quantize_int8_rows,
)
from torch import nn

Q = gguf.GGMLQuantizationType


def _weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, k)) * 0.05 + rng.standard_normal((n, 1)) * 0.01).astype(np.float32)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_int4_kernel_zero_point_convention():
    """torch's CPU int4 kernel computes with w = (q - 8) * s + z (the mapping relies on it)."""
    torch.manual_seed(0)
    n, k = 48, 128
    codes = Int4Codes(q=torch.randint(0, 16, (n, k), dtype=torch.int32),
                      scale=torch.rand(n, k // 32) * 0.1 + 0.01, zero=torch.randn(n, k // 32) * 0.1)
    x = torch.randn(5, k, dtype=torch.bfloat16)
    y = int4_matmul(x, pack_int4(codes))
    ref = x.float() @ codes.dequantize().t()
    assert _rel(y, ref) < 1e-2
    wrong = x.float() @ (codes.q.float() * codes.scale.repeat_interleave(32, 1)
                         + codes.zero.repeat_interleave(32, 1)).t()
    assert _rel(y, wrong) > 0.1


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_gguf_int4_codes_match_gguf_dequantisation_exactly(qtype):
    w = _weights(24, 96)
    raw = gq.quantize(w, qtype)
    ref = torch.from_numpy(gq.dequantize(raw, qtype))
    codes = gguf_int4_codes(torch.from_numpy(raw), qtype, rows=24)
    assert codes.q.min() >= 0 and codes.q.max() <= 15
    # float32 arithmetic of the mapping reproduces gguf's values to rounding of one fma
    torch.testing.assert_close(codes.dequantize(), ref, rtol=0, atol=1e-6)


def test_gguf_q8_0_values_exact_and_row_requant_accuracy():
    w = _weights(32, 256, seed=1)
    raw = gq.quantize(w, Q.Q8_0)
    exact = gguf_q8_0_values(torch.from_numpy(raw), rows=32)
    torch.testing.assert_close(exact, torch.from_numpy(gq.dequantize(raw, Q.Q8_0)), rtol=0, atol=0)
    q, scale = quantize_int8_rows(exact)
    assert _rel(q.float() * scale.unsqueeze(1), exact) < 1e-2


class _Layer(nn.Module):
    """What a model's linear layer looks like to a method after loading a GGUF tensor."""

    def __init__(self, w: np.ndarray, qtype: Q | None, bias: bool = False) -> None:
        super().__init__()
        raw = gq.quantize(w, qtype) if qtype is not None else None
        dense = torch.from_numpy(gq.dequantize(raw, qtype) if raw is not None else w)
        self.weight = nn.Parameter(dense.to(torch.bfloat16), requires_grad=False)
        self.bias = nn.Parameter(torch.randn(w.shape[0]).to(torch.bfloat16),
                                 requires_grad=False) if bias else None
        self.gguf_qtype = qtype
        self.gguf_raw = torch.from_numpy(raw) if raw is not None else None
        self.reference = dense  # float32 dequantised weight


@pytest.mark.parametrize("qtype,tol", [(Q.Q4_0, 1e-2), (Q.Q4_1, 1e-2), (Q.Q8_0, 2e-2), (None, 1e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_gguf_method_matches_dequantised_matmul(qtype, tol, bias):
    layer = _Layer(_weights(64, 192, seed=2), qtype, bias=bias)
    method = GGUFLinearMethod(LinearConfig("gguf", torch.bfloat16, torch.device("cpu")))
    method.process_weights_after_loading(layer)
    assert layer.quant_kind == {Q.Q4_0: "int4", Q.Q4_1: "int4", Q.Q8_0: "int8", None: "dense"}[qtype]
    x = torch.randn(2, 3, 192, dtype=torch.bfloat16)
    y = method.apply(layer, x)
    assert y.shape == (2, 3, 64) and y.dtype == torch.bfloat16
    ref = F.linear(x.float(), layer.reference, None if layer.bias is None else layer.bias.float())
    assert _rel(y, ref) < tol


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_gguf_method_float32(qtype, kernel_mode):
    """A float32 model: native block kernels (or torch's int4/int8 without them), float32 out."""
    layer = _Layer(_weights(32, 64), qtype)
    method = GGUFLinearMethod(LinearConfig("gguf", torch.float32, torch.device("cpu")))
    method.process_weights_after_loading(layer)
    expect = "native" if kernel_mode == "native" else ("int8" if qtype == Q.Q8_0 else "int4")
    assert layer.quant_kind == expect
    x = torch.randn(4, 64)
    y = method.apply(layer, x)
    assert y.dtype == torch.float32
    assert _rel(y, x @ layer.reference.t()) < 2e-2


def test_int8_weight_only_method_against_bf16():
    w = _weights(96, 160, seed=3)
    layer = _Layer(w, None)
    method = Int8WeightOnlyLinearMethod(LinearConfig("w8", torch.bfloat16, torch.device("cpu")))
    method.process_weights_after_loading(layer)
    assert layer.weight is None
    x = torch.randn(7, 160, dtype=torch.bfloat16)
    assert _rel(method.apply(layer, x), x.float() @ torch.from_numpy(w).t()) < 1e-2


def test_quantize_int4_roundtrip_error_bounded():
    w = torch.from_numpy(_weights(16, 128))
    codes = quantize_int4(w)
    step = codes.scale.repeat_interleave(32, 1)
    assert ((codes.dequantize() - w).abs() <= step / 2 + 1e-6).all()


def test_gguf_method_lm_head_quantized(kernel_mode, monkeypatch):
    """Native: Q8 blocks of 32 against float32 activations (INFER_CPU_ACTIVATIONS=float32; the
    default int16 activations are tested in test_gemm_builds.py); torch: per-row int8."""
    from infer.core.model.layers.embedding import LMHead

    monkeypatch.setenv("INFER_CPU_ACTIVATIONS", "float32")

    class _Ctx:
        dtype, device = torch.float32, torch.device("cpu")

    head = LMHead(300, 64, _Ctx())
    head.weight.data.copy_(torch.from_numpy(_weights(300, 64, seed=4)))
    x = torch.randn(3, 64)
    ref = head(x)
    GGUFLinearMethod(LinearConfig("gguf", torch.float32, torch.device("cpu"))).process_lm_head(head)
    y = head(x)
    assert y.dtype == torch.float32
    if kernel_mode == "native":
        assert head.qweight.kind == 8 and head.qweight.blocks.dtype == torch.uint8
        assert _rel(y, F.linear(x, head.qweight.dequantize())) < 1e-5  # only weight quantization
    else:
        assert head.int8_q.dtype == torch.int8
    assert _rel(y, ref) < 1e-2
    assert (y.argmax(-1) == ref.argmax(-1)).float().mean() >= 2 / 3


def test_gguf_method_float32_activations_for_every_row_count(kernel_mode, monkeypatch):
    """Native, INFER_CPU_ACTIVATIONS=float32: float32 activations against the exactly dequantised
    blocks at every row count (no switch to another kernel for large batches), each row the same
    bits alone or in a batch; the dense copy is dropped."""
    if kernel_mode != "native":
        pytest.skip("the native kernels' path")
    monkeypatch.setenv("INFER_CPU_ACTIVATIONS", "float32")
    layer = _Layer(_weights(32, 64), Q.Q4_1, bias=True)
    layer.weight.data = layer.reference.clone()  # a float32 model's layer
    layer.bias.data = layer.bias.data.float()
    method = GGUFLinearMethod(LinearConfig("gguf", torch.float32, torch.device("cpu")))
    method.process_weights_after_loading(layer)
    assert layer.quant_kind == "native" and layer.weight is None
    x = torch.randn(100, 64)
    alone = torch.cat([method.apply(layer, x[i:i + 1]) for i in range(100)])
    for m in (1, 2, 31, 32, 33, 100):
        y = method.apply(layer, x[:m])
        assert torch.equal(y, alone[:m])
        torch.testing.assert_close(y, F.linear(x[:m], layer.reference, layer.bias),
                                   rtol=1e-5, atol=1e-5)
