"""The start-up gate against a hand-made support matrix, and against the real CPU platform."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from infer.core.config import ServerArgs
from infer.core.config.gate import GateError, check_flags, run_gate
from infer.core.platform import DeviceInfo, Platform, SettingAdjustment
from infer.core.plugins import Registries
from infer.core.support import Entry, Status, SupportMatrix


class FakePlatform(Platform):
    name = "fakedev"

    def default_adjustments(self, args):
        return [SettingAdjustment("max_running_requests", 4, "small device"),
                SettingAdjustment("page_size", 64, "paged kernels want 64")]


def _setup(rows):
    matrix = SupportMatrix()
    matrix.add("fakedev", rows, ["gen1", "gen2"])
    registries = Registries()
    registries.attention["my_attn"] = [SimpleNamespace(runs_on=lambda p: p == "fakedev")]
    platform = FakePlatform(DeviceInfo(kind="fakedev", generation="gen1", name="Fake", memory_bytes=1))
    platform.bind_matrix(matrix)
    return platform, SimpleNamespace(matrix=matrix, registries=registries)


ROWS = [
    Entry("--model-path", Status.SUPPORTED),
    Entry("--page-size", Status.SUPPORTED),
    Entry("--attention-backend", Status.SUPPORTED, value="torch_native"),
    Entry("--attention-backend", Status.SUPPORTED, value="my_attn"),
    Entry("--attention-backend", Status.EXPERIMENTAL, value="triton", reason="new kernel"),
    Entry("--attention-backend", Status.UNSUPPORTED, value="fa3", reason="needs Hopper tensor cores",
          instead="use torch_native"),
    Entry("--attention-backend", Status.SUPPORTED, value="flashinfer", generations=frozenset({"gen2"})),
    Entry("--disable-radix-cache", Status.NOT_IMPLEMENTED, reason="the radix cache is always on"),
]


def test_unsupported_value_names_flag_value_device_reason_and_alternatives():
    platform, host = _setup(ROWS)
    with pytest.raises(GateError) as err:
        check_flags(ServerArgs(model_path="m", attention_backend="fa3"), platform, host)
    msg = str(err.value)
    assert "--attention-backend fa3 is not supported on device fakedev (generation gen1)" in msg
    assert "needs Hopper tensor cores" in msg
    # alternatives: values that run on gen1 (flashinfer only runs on gen2), plus the entry's instead
    assert "values of --attention-backend that run here: triton, torch_native, my_attn" in msg
    assert "instead: use torch_native" in msg
    assert err.value.problems[0][:2] == ("--attention-backend", "fa3")


def test_not_implemented_flag_and_every_problem_in_one_message():
    platform, host = _setup(ROWS)
    with pytest.raises(GateError) as err:
        check_flags(ServerArgs(disable_radix_cache=True, max_running_requests=3), platform, host)
    msg = str(err.value)
    assert msg.startswith("2 settings cannot run on device fakedev (generation gen1)")
    assert "--disable-radix-cache is not implemented" in msg and "the radix cache is always on" in msg
    assert "--max-running-requests 3 is not implemented" in msg


def test_alias_spelling_is_shown():
    platform, host = _setup(ROWS)
    with pytest.raises(GateError, match=r"--disable-radix-cache \(given as --no-enable-prefix-caching\)"):
        check_flags(ServerArgs(no_enable_prefix_caching=True), platform, host)


def test_experimental_warns_supported_passes_default_values_are_not_gated():
    platform, host = _setup(ROWS)
    warnings = check_flags(ServerArgs(model_path="m", attention_backend="triton", page_size=16,
                                      disable_radix_cache=False), platform, host)
    assert len(warnings) == 1 and "--attention-backend triton is experimental" in warnings[0]
    assert "new kernel" in warnings[0]


def test_plugin_registered_value_runs_and_unknown_value_is_refused():
    platform, host = _setup(ROWS)
    assert check_flags(ServerArgs(attention_backend="my_attn"), platform, host) == []
    with pytest.raises(GateError, match="no installed plugin registers 'nope' for fakedev"):
        check_flags(ServerArgs(attention_backend="nope"), platform, host)


def test_platform_defaults_change_only_unset_settings_and_keep_provenance():
    platform, host = _setup(ROWS)
    args = ServerArgs(page_size=16)
    report = run_gate(args, platform, host)
    assert [a.name for a in report.adjustments] == ["max_running_requests"]
    assert args.max_running_requests == 4 and args.provenance["max_running_requests"] == "platform default"
    assert args.page_size == 16 and args.provenance["page_size"] == "user"


def test_real_cpu_platform_refuses_fa3():
    from infer.core.plugins import get_plugin_host

    host = get_plugin_host()
    platform = host.select("cpu")
    with pytest.raises(GateError) as err:
        run_gate(ServerArgs(model_path="x", attention_backend="fa3"), platform, host)
    msg = str(err.value)
    assert "--attention-backend fa3" in msg and "device cpu" in msg and platform.generation in msg


def test_platform_defaults_are_applied_and_logged_once_across_processes(caplog):
    # `infer serve` gates in the CLI, then the engine process gates the (pickled) settings again
    import logging
    import pickle

    platform, host = _setup(ROWS)
    args = ServerArgs(page_size=16)
    with caplog.at_level(logging.INFO, logger="infer.config"):
        first = run_gate(args, platform, host)
        again = pickle.loads(pickle.dumps(args))
        second = run_gate(again, platform, host)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("platform default")]
    assert len(lines) == 1 and "--max-running-requests" in lines[0]
    assert [a.name for a in first.adjustments] == ["max_running_requests"] and second.adjustments == []
    assert again.max_running_requests == 4 and again.provenance["max_running_requests"] == "platform default"
