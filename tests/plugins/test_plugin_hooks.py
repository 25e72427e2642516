"""Every hook goes through pluggy (``pm.hook``), one plugin at a time: ``@hookimpl`` is what makes
a function a hook (its options included), and a plugin whose hook raises is recorded while the
others still load."""

from __future__ import annotations

import types

from infer.core.hookspecs import hookimpl
from infer.core.plugins import PluginHost
from infer.core.support import Entry, Status


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(INFER_API_VERSION=1, **attrs)
    return mod


def _failures(host: PluginHost, plugin: str) -> list[str]:
    return [f.error for f in host.failures if f.name == plugin]


def test_a_hookimpl_under_another_name_is_called_through_specname():
    # pluggy's specname lets a plugin name its function freely; only pm.hook honours it
    @hookimpl(specname="register_models")
    def add_my_models(register):
        register("MyArch", object)

    host = PluginHost()
    assert host.add_module(_module("named", add_my_models=add_my_models))
    assert host.registries.models["MyArch"] is object
    assert not host.failures


def test_an_unmarked_register_function_is_not_called_and_is_reported():
    called = []

    def register_attention_backends(register):  # no @hookimpl
        called.append(register)
        register("unmarked", object, platforms=["cpu"])

    host = PluginHost()
    assert host.add_module(_module("unmarked", register_attention_backends=register_attention_backends))
    assert not called and "unmarked" not in host.registries.attention
    (error,) = _failures(host, "unmarked")
    assert "register_attention_backends is not marked @hookimpl" in error


def test_a_hookimpl_that_names_no_hook_is_reported():
    @hookimpl
    def register_layer_op(register):  # a typo of register_layer_ops
        register("rms_norm", object)

    host = PluginHost()
    host.add_module(_module("typo", register_layer_op=register_layer_op))
    (error,) = _failures(host, "typo")
    assert "register_layer_op matches no hook" in error and "register_layer_ops" in error


def test_a_raising_hook_is_recorded_and_the_other_plugins_still_load():
    @hookimpl
    def register_attention_backends(register):
        raise RuntimeError("kernel library missing")

    @hookimpl
    def register_support_matrix(register):
        raise OSError("support data unreadable")

    def good_hooks(name: str) -> dict:
        @hookimpl
        def register_attention_backends(register):
            register(name, object, platforms=["cpu"])

        @hookimpl
        def register_support_matrix(register):
            register("cpu", [Entry(flag="--attention-backend", value=name, status=Status.SUPPORTED)],
                     ["avx512"])

        return {"register_attention_backends": register_attention_backends,
                "register_support_matrix": register_support_matrix}

    host = PluginHost()
    host.add_module(_module("before", **good_hooks("before_attn")))
    host.add_module(_module("flaky", register_attention_backends=register_attention_backends,
                            register_support_matrix=register_support_matrix))
    host.add_module(_module("after", **good_hooks("after_attn")))
    # both neighbours' registrations landed, through the same hook call path
    assert set(host.registries.attention) == {"before_attn", "after_attn"}
    cpu = host.matrix.platforms["cpu"]
    for name in ("before_attn", "after_attn"):
        assert cpu.lookup("avx512", "--attention-backend", name).status is Status.SUPPORTED
    errors = _failures(host, "flaky")
    assert any("register_attention_backends failed" in e and "kernel library missing" in e
               for e in errors)
    assert any("register_support_matrix failed" in e and "support data unreadable" in e for e in errors)
    assert not _failures(host, "before") and not _failures(host, "after")
    assert {r.name: r.loaded for r in host.records} == {"before": True, "flaky": True, "after": True}


def test_readme_lists_every_hook():
    from pathlib import Path

    from infer.core.plugins import HOOK_NAMES

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Writing a third-party plugin"):]
    section = section[:section.index("\n## ", 1)]
    missing = [name for name in HOOK_NAMES if f"`{name}`" not in section]
    assert not missing, f"README's hook list misses {missing}"
