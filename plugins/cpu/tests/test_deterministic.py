"""--enable-deterministic-inference on the CPU: every component the batch-invariant kernels do
not serve refuses at load with a message naming the flag (never a silent fallback); the native
GGUF path accepts it at every activation precision (int16, the default; float32; int8)."""

from __future__ import annotations

import gguf
import pytest
import torch
from infer.core.ops.attention import AttentionConfig
from infer.core.ops.linear import LinearConfig
from infer_cpu import kernels
from infer_cpu.ops.attention import TorchNativeAttention
from infer_cpu.ops.linear_native import NativeDenseLinearMethod
from infer_cpu.quant.methods import GGUFLinearMethod, Int8WeightOnlyLinearMethod
from torch import nn

Q = gguf.GGMLQuantizationType
CPU = torch.device("cpu")


def _layer(dtype: torch.dtype, qtype: Q | None = Q.Q4_1) -> nn.Module:
    w = torch.randn(32, 64)
    layer = nn.Module()
    layer.weight = nn.Parameter(w.to(dtype), requires_grad=False)
    layer.bias = None
    layer.gguf_qtype = qtype
    layer.gguf_raw = (torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype))
                      if qtype is not None else None)
    return layer


def _attn_config(kv_dtype: torch.dtype, dtype: torch.dtype = torch.float32) -> AttentionConfig:
    return AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=32, scale=32 ** -0.5,
                           page_size=4, dtype=dtype, kv_dtype=kv_dtype, device=CPU,
                           num_layers=1, deterministic=True)


@pytest.mark.skipif(kernels.load() is None, reason="needs the native kernels")
def test_native_gguf_path_accepts_the_flag():
    method = GGUFLinearMethod(LinearConfig("gguf", torch.float32, CPU, deterministic=True))
    layer = _layer(torch.float32)
    method.process_weights_after_loading(layer)
    assert layer.quant_kind == "native"
    TorchNativeAttention(_attn_config(torch.float32))


@pytest.mark.parametrize("dtype,qtype", [(torch.bfloat16, Q.Q4_1), (torch.float32, None)])
def test_gguf_layers_off_the_native_path_are_refused(dtype, qtype):
    method = GGUFLinearMethod(LinearConfig("gguf", dtype, CPU, deterministic=True))
    with pytest.raises(ValueError, match="--enable-deterministic-inference"):
        method.process_weights_after_loading(_layer(dtype, qtype))


def test_dense_and_int8wo_methods_are_refused():
    for method in (NativeDenseLinearMethod(LinearConfig(None, torch.float32, CPU, deterministic=True)),
                   Int8WeightOnlyLinearMethod(LinearConfig("w8", torch.float32, CPU, deterministic=True))):
        with pytest.raises(ValueError, match="--enable-deterministic-inference"):
            method.process_weights_after_loading(_layer(torch.float32, None))


def test_attention_of_a_bf16_model_is_refused():
    with pytest.raises(ValueError, match="--enable-deterministic-inference"):
        TorchNativeAttention(_attn_config(torch.bfloat16, torch.bfloat16))
    # without the flag the reference serves it
    TorchNativeAttention(AttentionConfig(**{**_attn_config(torch.bfloat16, torch.bfloat16).__dict__,
                                            "deterministic": False}))


@pytest.mark.skipif(kernels.load() is None, reason="needs the native kernels")
def test_a_float32_model_over_a_bf16_cache_accepts_the_flag():
    """float32 queries over a bf16 cache run the per-row native kernel (invariant)."""
    TorchNativeAttention(_attn_config(torch.bfloat16))
