"""The core's plain-torch references are registered for every platform by the core's own plugin,
and a platform's own registration of the same name wins over them whatever the load order."""

from __future__ import annotations

import infer_cpu
import pytest
from infer.core.hookspecs import hookimpl
from infer.core.model import registry
from infer.core.ops.comm import ProcessGroupCommunicator
from infer.core.ops.reference.attention import TorchNativeAttention
from infer.core.ops.reference.linear import DenseLinearMethod
from infer.core.ops.reference.moe import TorchMoERunner
from infer.core.plugins import PluginHost, Registries


def _host(*modules) -> PluginHost:
    host = PluginHost()
    for m in modules:
        assert host.add_module(m)
    return host


def test_references_run_on_a_platform_no_plugin_names():
    reg = _host(registry).registries
    assert Registries.pick(reg.attention, "torch_native", "somechip") is TorchNativeAttention
    assert Registries.pick(reg.linear, None, "somechip") is DenseLinearMethod
    assert Registries.pick(reg.moe, "torch", "somechip") is TorchMoERunner
    assert Registries.pick(reg.communicators, "gloo", "somechip") is ProcessGroupCommunicator
    assert "torch_native" in Registries.names_for(reg.attention, "somechip")


@pytest.mark.parametrize("order", ["core first", "plugin first"])
def test_platform_registration_wins_over_the_reference(order):
    modules = (registry, infer_cpu) if order == "core first" else (infer_cpu, registry)
    reg = _host(*modules).registries
    cpu_attention = Registries.pick(reg.attention, "torch_native", "cpu")
    assert cpu_attention.__module__ == "infer_cpu.ops.attention"
    assert issubclass(cpu_attention, TorchNativeAttention)
    assert Registries.pick(reg.attention, "torch_native", "other") is TorchNativeAttention


def test_last_platform_registration_wins_among_equals():
    class Override:
        INFER_API_VERSION = 1

        @hookimpl
        def register_moe_runners(self, register):
            register("torch", "some.module:Runner", ["cpu"])

    reg = _host(registry, infer_cpu, Override()).registries
    assert [c.factory for c in reg.moe["torch"]][-1] == "some.module:Runner"
    with pytest.raises(ModuleNotFoundError):  # the override is the one picked (and imported)
        Registries.pick(reg.moe, "torch", "cpu")
    assert Registries.pick(reg.moe, "torch", "other") is TorchMoERunner
