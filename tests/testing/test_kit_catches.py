"""Every check of the conformance kit fails on a deliberately broken op (tests/testing/broken_ops.py)
and passes the core's references; refusals and declines are reported, not hidden."""

from __future__ import annotations

import sys
from pathlib import Path

import infer_cpu
import pytest
import torch
from infer.core.hookspecs import hookimpl
from infer.core.model import registry
from infer.core.plugins import PluginHost
from infer.core.testing import Case, ConformanceFailure, Target, discover, run_case
from infer.core.testing.check_ops import KitCannotBuild

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # broken_ops, importable by the two-rank check's processes too
import broken_ops  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_platform():
    host = PluginHost()
    host.add_module(infer_cpu)
    host.add_module(registry)
    return host.select("cpu")


def _target(platform=None, ranks=(1,)):
    return Target("cpu", CPU, platform, ranks=ranks)


def _case(kind, key, factory):
    return Case(kind, key, factory, "broken_ops")


@pytest.mark.parametrize("broken,why", [
    (broken_ops.IgnoresPrefix, "relative error"),
    (broken_ops.ForgetsKV, "KV cache"),
    (broken_ops.ReadsOneSlotTooMany, "relative error"),
    (broken_ops.PlansOnce, "raised"),
])
def test_attention_check_fails_a_broken_backend(broken, why):
    with pytest.raises(ConformanceFailure, match=why) as err:
        run_case(_case("attention", broken.__name__, broken), _target())
    assert "disagree with the reference" in str(err.value)


def test_prefix_bug_is_caught_only_where_a_prefix_exists():
    """The failures name the scenarios with cached prefixes, not the pure prefills."""
    with pytest.raises(ConformanceFailure) as err:
        run_case(_case("attention", "p", broken_ops.IgnoresPrefix), _target())
    text = str(err.value)
    assert "extend-over-prefix" in text and "decode" in text and "\n    prefill:" not in text


def test_attention_refusals_are_listed_and_refusing_everything_fails():
    ok = run_case(_case("attention", "p16", broken_ops.RefusesPageSizeOne), _target())
    assert len(ok.matched) == 2 and len(ok.refused) == 2 and "page size 1" in ok.refused[0]
    with pytest.raises(ConformanceFailure, match="refused every configuration"):
        run_case(_case("attention", "none", broken_ops.RefusesEverything), _target())


def test_fp8_caches_are_checked_when_asked_and_may_be_refused():
    from infer.core.ops.reference.attention import TorchNativeAttention

    t = Target("cpu", CPU, ranks=(1,), kv_cache_dtypes=(torch.float8_e4m3fn,))
    out = run_case(_case("attention", "ref", TorchNativeAttention), t)
    assert len(out.matched) == 8 and sum("kv float8_e4m3fn" in m for m in out.matched) == 4
    out = run_case(_case("attention", "nofp8", broken_ops.RefusesFp8Cache), t)
    assert len(out.matched) == 4 and all("refuses an fp8 cache" in r for r in out.refused)
    with pytest.raises(ConformanceFailure, match="kv float8_e4m3fn"):
        run_case(_case("attention", "p", broken_ops.IgnoresPrefix), t)


def test_the_reference_attention_passes():
    from infer.core.ops.reference.attention import TorchNativeAttention

    out = run_case(_case("attention", "ref", TorchNativeAttention), _target())
    assert len(out.matched) == 4 and not out.failures


@pytest.mark.parametrize("key,broken,why", [
    (None, broken_ops.DropsBias, r"\+bias.*relative error"),
    ("int2", broken_ops.CoarseInt2, "relative error"),
])
def test_linear_check_fails_a_broken_method(key, broken, why):
    with pytest.raises(ConformanceFailure, match=why):
        run_case(_case("linear", key, broken), _target())


def test_gguf_layers_get_raw_blocks():
    """For "gguf" the kit hands the method real GGUF blocks: the CPU method packs them."""
    seen = []

    class Spy(broken_ops.DenseLinearMethod):
        def process_weights_after_loading(self, layer):
            seen.append((layer.gguf_qtype.name, tuple(layer.gguf_raw.shape), layer.gguf_raw.dtype))

    run_case(_case("linear", "gguf", Spy), _target())
    assert {s[0] for s in seen} == {"Q8_0", "Q4_0", "Q4_1"}
    assert all(s[2] == torch.uint8 for s in seen)


def test_moe_check_fails_a_runner_that_ignores_routing_weights():
    with pytest.raises(ConformanceFailure, match="relative error"):
        run_case(_case("moe", "w", broken_ops.IgnoresRoutingWeights), _target())


@pytest.mark.parametrize("name,fn", [
    ("rms_norm", broken_ops.rms_norm_without_residual),
    ("rotary", broken_ops.rotary_wrong_half),
    ("silu_and_mul", broken_ops.silu_on_the_wrong_half),
])
def test_layer_op_check_fails_a_broken_op(name, fn):
    with pytest.raises(ConformanceFailure, match="relative error"):
        run_case(_case("layer_op", name, fn), _target())


def test_layer_op_check_rejects_unknown_names_and_reports_declines():
    with pytest.raises(ConformanceFailure, match="the core knows only"):
        run_case(_case("layer_op", "gelu", lambda x: x), _target())
    out = run_case(_case("layer_op", "silu_and_mul", lambda x: None), _target())
    assert not out.matched and len(out.refused) == 6


@pytest.mark.slow
@pytest.mark.parametrize("broken,why", [
    ("broken_ops:SkipsAllReduce", "all_reduce"),
    ("broken_ops:GathersInReverse", "all_gather"),
])
def test_communicator_check_fails_a_broken_collective_over_two_ranks(broken, why):
    one_rank = run_case(_case("communicator", "gloo", broken), _target(ranks=(1,)))
    assert one_rank.matched  # with one rank every collective is the identity
    with pytest.raises(ConformanceFailure, match=why):
        run_case(_case("communicator", "gloo", broken), _target(ranks=(2,)))


@pytest.mark.slow
def test_graph_check_fails_a_replay_that_loses_positions(cpu_platform):
    with pytest.raises(ConformanceFailure, match="relative error"):
        run_case(_case("graph_runner", "g", broken_ops.ReplaysAtPositionZero),
                 _target(cpu_platform))
    good = run_case(_case("graph_runner", "g", broken_ops.ReplaysEagerly), _target(cpu_platform))
    assert len(good.matched) == 2
    padded = run_case(_case("graph_runner", "g", broken_ops.PadsIntoScratch), _target(cpu_platform))
    assert len(padded.matched) == 2  # the scratch page is the padding rows' to write
    with pytest.raises(ConformanceFailure, match="KV cache after replay differs"):
        run_case(_case("graph_runner", "g", broken_ops.WritesOutsideTheBatch),
                 _target(cpu_platform))
    declined = run_case(_case("graph_runner", "g", broken_ops.DeclinesEverything),
                        _target(cpu_platform))
    assert not declined.matched and "captured nothing" in declined.refused[0]


def test_discovery_finds_a_plugins_ops_through_the_registries():
    class Third:
        INFER_API_VERSION = 1

        @hookimpl
        def register_attention_backends(self, register):
            register("bad_attn", broken_ops.IgnoresPrefix, ["cpu"])

        @hookimpl
        def register_layer_ops(self, register):
            register("rotary", broken_ops.rotary_wrong_half, "otherchip")

    host = PluginHost()
    for m in (registry, infer_cpu, Third()):
        assert host.add_module(m)
    cpu = {str(c): c for c in discover("cpu", host)}
    assert "attention:bad_attn" in cpu and cpu["attention:bad_attn"].factory is broken_ops.IgnoresPrefix
    assert "layer_op:rotary" in cpu and "infer_cpu" in cpu["layer_op:rotary"].factory
    other = {str(c) for c in discover("otherchip", host)}
    # the core's references are not checked against themselves; communicators always are
    assert other == {"layer_op:rotary", "communicator:gloo"}
    with pytest.raises(KitCannotBuild):  # a graph runner cannot be checked on a bare device
        run_case(_case("graph_runner", "g", broken_ops.ReplaysEagerly), _target())
