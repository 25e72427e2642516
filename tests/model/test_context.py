"""ModelContext resolution: names from the registries, the GGUF linear-method seam, errors."""

from __future__ import annotations

import infer_cpu
import pytest
import torch
from infer.core.hookspecs import hookimpl
from infer.core.model import registry
from infer.core.model.context import ModelContext, ModelContextError
from infer.core.ops.linear import LinearMethod
from infer.core.ops.reference.linear import DenseLinearMethod
from infer.core.plugins import PluginHost


class _GGUFMethod(LinearMethod):
    def apply(self, layer, x):
        return x @ layer.weight.t()


class _GGUFPlugin:
    """A stand-in for the CPU speed engineer's plugin that registers quantization "gguf"."""

    INFER_API_VERSION = 1

    @hookimpl
    def register_linear_methods(self, register):
        register("gguf", _GGUFMethod, "cpu")


def _host(with_gguf: bool) -> PluginHost:
    host = PluginHost()
    host.add_module(infer_cpu)
    host.add_module(registry)
    host.registries.linear.pop("gguf", None)  # the CPU plugin's own method is not under test
    host.registries.linear.pop("torchao:int8wo", None)  # likewise (--torchao-config int8wo)
    if with_gguf:
        host.add_module(_GGUFPlugin())
    return host


def test_defaults_resolve_to_cpu_references():
    host = _host(False)
    platform = host.select("cpu")
    ctx = ModelContext.build(platform=platform, host=host, dtype=torch.float32)
    assert ctx.attention_backend_name == "torch_native"
    assert type(ctx.moe_runner).__name__ == "TorchMoERunner"
    # the CPU plugin's dense method: the core's reference, with the native bf16 GEMM for bf16
    assert type(ctx.linear_method).__name__ == "NativeDenseLinearMethod"
    assert isinstance(ctx.linear_method, DenseLinearMethod)
    assert ctx.quantization is None and ctx.comm.world_size == 1


@pytest.mark.parametrize("load_format,explicit,with_gguf,expect", [
    ("gguf", False, True, "gguf"),
    ("gguf", True, True, None),  # --dtype given: dequantised weights, default method
    ("safetensors", False, True, None),
    ("gguf", False, False, None),  # no plugin offers "gguf": default method
])
def test_gguf_linear_method_seam(load_format, explicit, with_gguf, expect):
    host = _host(with_gguf)
    ctx = ModelContext.build(platform=host.select("cpu"), host=host, dtype=torch.float32,
                             load_format=load_format, dtype_explicit=explicit)
    assert ctx.quantization == expect
    assert isinstance(ctx.linear_method, _GGUFMethod) == (expect == "gguf")
    assert type(ctx.dense_linear_method).__name__ == "NativeDenseLinearMethod"


def test_unknown_names_list_what_is_available():
    host = _host(False)
    platform = host.select("cpu")
    with pytest.raises(ModelContextError, match=r"--quantization awq.*available: None"):
        ModelContext.build(platform=platform, host=host, dtype=torch.float32, quantization="awq")
    with pytest.raises(ModelContextError, match=r"--moe-runner-backend x.*auto, torch"):
        ModelContext.build(platform=platform, host=host, dtype=torch.float32, moe_runner_backend="x")
