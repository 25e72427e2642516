"""The multi-rank executor with real processes over gloo: tp=2 against one rank, a rank that
dies, and the parallel layouts refused at start-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import random_prompts, run_all
from infer.core.config import ConfigError, ServerArgs
from infer.core.config.gate import run_gate
from infer.core.engine.engine_core import EngineCore
from infer.core.plugins import get_plugin_host

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def cpu():
    return get_plugin_host().select("cpu")


def _core(model_dir, cpu, gate=True, **flags):
    flags.setdefault("dtype", "float32")
    flags.setdefault("max_total_tokens", 4096)
    args = ServerArgs(model_path=str(model_dir), device="cpu", **flags)
    if gate:
        run_gate(args, platform=cpu, host=get_plugin_host())  # the matrix allows the layout
    return EngineCore(args, platform=cpu)


@pytest.mark.slow
def test_tp2_gives_the_tokens_of_one_rank(tiny_model, cpu):
    """Greedy tokens of tp=2 (two processes, heads and MLP split, vocab-parallel head) equal one
    rank's, through prefix-cache hits and chunked prefill."""
    prompts = random_prompts(6, seed=3)
    prompts += [prompts[0] + [7, 8, 9]]  # a prefix-cache hit
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    want = {k: v[0] for k, v in run_all(_core(tiny_model[0], cpu), prompts, params).items()}
    core = _core(tiny_model[0], cpu, tp_size=2, chunked_prefill_size=16)
    try:
        assert core.executor.loaded.ctx.tp_size == 2
        got = {k: v[0] for k, v in run_all(core, prompts, params, stagger=2).items()}
        assert core.executor.steps > 0
    finally:
        core.shutdown()
    assert got == want
    assert all(p.poll() is not None for p in core.executor.procs), "rank processes left behind"


@pytest.mark.slow
def test_tp2_with_overlap_scheduling_gives_the_tokens_of_one_rank(tiny_model, cpu):
    """Overlap scheduling across ranks: deferred steps' sampled ids stay on rank 0, the next
    step's placeholders are resolved on every rank from the ids rank 0 broadcasts. (The CPU
    default is off, the forward running on the host thread; it is switched on here to run the
    protocol.)"""
    prompts = random_prompts(5, seed=5)
    params = {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True}
    want = {k: v[0] for k, v in run_all(_core(tiny_model[0], cpu), prompts, params).items()}
    core = _core(tiny_model[0], cpu, tp_size=2, disable_overlap_schedule=False)
    deferred = []
    launch = core.executor.launch

    def counted(batch, defer):
        step = launch(batch, defer)
        deferred.append(step.deferred and bool(step.reqs))
        return step

    core.executor.launch = counted
    try:
        assert core.overlap
        got = {k: v[0] for k, v in run_all(core, prompts, params, stagger=2).items()}
    finally:
        core.shutdown()
    assert sum(deferred) >= 5, deferred  # the decode steps ran deferred
    assert got == want
    assert all(p.poll() is not None for p in core.executor.procs), "rank processes left behind"


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_pipeline_stages_give_the_tokens_of_one_rank(tiny_model, cpu, tp):
    """--pp-size 2 (layers split into two stages passing hidden states with send/recv), alone and
    with --tp-size 2 inside each stage (four processes), equals one rank."""
    prompts = random_prompts(4, seed=7)
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    want = {k: v[0] for k, v in run_all(_core(tiny_model[0], cpu), prompts, params).items()}
    # 4 ranks exceed this 2-core machine's one rank per core, which the gate refuses for serving;
    # oversubscribed, they still compute the same tokens
    core = _core(tiny_model[0], cpu, gate=tp * 2 <= os.cpu_count(), tp_size=tp, pp_size=2,
                 disable_overlap_schedule=True, chunked_prefill_size=16)
    try:
        stage = core.executor.loaded.ctx.pipeline
        assert stage.is_first and list(stage.layers) == [0]  # the tiny model has 2 layers
        assert core.runner.kv_cache.k[1].numel() == 0  # no cache for the other stage's layer
        got = {k: v[0] for k, v in run_all(core, prompts, params, stagger=1).items()}
    finally:
        core.shutdown()
    assert got == want


_KILLED = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host
    core = EngineCore(ServerArgs(model_path={model!r}, dtype="float32", max_total_tokens=4096,
                                 tp_size=2), platform=get_plugin_host().select("cpu"))
    print("WORKER", core.executor.procs[0].pid, flush=True)
    while True:
        core.add_request(core.make_request(str(time.time()), [5, 6, 7], {{"max_new_tokens": 50}}))
        while core.has_work():
            core.step()
""")


@pytest.mark.slow
def test_a_killed_rank_ends_the_engine(tiny_model):
    """A rank killed mid-serving: the engine process exits non-zero within seconds (the server
    then answers 503 and exits, as for any dead engine), and no rank process is left."""
    code = _KILLED.format(here=str(HERE), model=str(tiny_model[0]))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("WORKER"), line
        worker = int(line.split()[1])
        time.sleep(1.0)
        os.kill(worker, signal.SIGKILL)
        t = time.monotonic()
        rc = proc.wait(timeout=60)
        assert rc != 0 and time.monotonic() - t < 30
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(("flags", "match"), [
    (dict(tp_size=2, nnodes=3), "--nnodes"),
    (dict(tp_size=2, nnodes=2), "--dist-init-addr"),
    (dict(tp_size=2, node_rank=1), "--node-rank 1"),
    (dict(tp_size=512), "ranks on this node"),
    (dict(tp_size=2, dp_size=256), "ranks on this node"),
])
def test_bad_layouts_are_refused_before_loading(cpu, flags, match):
    with pytest.raises(ConfigError, match=match):
        run_gate(ServerArgs(model_path="unused", **flags), platform=cpu, host=get_plugin_host())


def test_a_taken_rendezvous_port_is_refused(cpu):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is already in use"):
            run_gate(ServerArgs(model_path="unused", tp_size=2, dist_init_addr=f"127.0.0.1:{port}"),
                     platform=cpu, host=get_plugin_host())


def test_ray_backend_needs_ray(cpu, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a))
    with pytest.raises(ConfigError, match="Ray is not installed"):
        run_gate(ServerArgs(model_path="unused", tp_size=2, distributed_executor_backend="ray"),
                 platform=cpu, host=get_plugin_host())


@pytest.mark.slow
def test_ray_executor_gives_the_tokens_of_one_rank(tiny_model, cpu):
    """--distributed-executor-backend ray on a local Ray: rank 1 is a Ray actor."""
    pytest.importorskip("ray")
    import ray

    prompts = random_prompts(3, seed=5)
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    want = {k: v[0] for k, v in run_all(_core(tiny_model[0], cpu), prompts, params).items()}
    core = _core(tiny_model[0], cpu, tp_size=2, distributed_executor_backend="ray")
    try:
        assert type(core.executor).__name__ == "RayExecutor"
        got = {k: v[0] for k, v in run_all(core, prompts, params).items()}
    finally:
        core.shutdown()
        ray.shutdown()
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_moe_tp2_ep2_gives_the_tokens_of_one_rank(tmp_path, cpu, arch):
    """--tp-size 2 --enable-expert-parallel (experts split over the two ranks, tokens combined
    through the communicator) through the engine equals one rank."""
    sys.path.insert(0, str(HERE.parent / "model"))
    from hf_tiny import save_tiny

    save_tiny(arch, tmp_path)
    prompts = random_prompts(3, seed=11, vocab=90)
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    one = _core(tmp_path, cpu, skip_tokenizer_init=True)
    want = {k: v[0] for k, v in run_all(one, prompts, params).items()}
    core = _core(tmp_path, cpu, skip_tokenizer_init=True, tp_size=2, enable_expert_parallel=True)
    try:
        assert core.executor.loaded.ctx.ep_size == 2
        got = {k: v[0] for k, v in run_all(core, prompts, params).items()}
    finally:
        core.shutdown()
    assert got == want


def test_serve_refuses_a_split_the_model_cannot_take(tiny_model):
    """Expert parallelism on a model without experts: exit 2 with the values, before any weight
    loads (the engine process never starts)."""
    import shutil

    out = subprocess.run([shutil.which("infer") or "infer", "serve", "--model-path", str(tiny_model[0]),
                          "--device", "cpu", "--tp-size", "2", "--ep-size", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--ep-size 2" in out.stderr and "Traceback" not in out.stderr
