"""CUDA graphs under tensor parallelism: what can be checked without a GPU, and the GPU checks.

Without a GPU (torch.cuda's graph API replaced by recorders): the CUDA plugin's graph runner sets
the communicator up (``warmup``) before anything is captured, the model's all-reduces are issued
inside each capture (so a replay runs them in the graph), every capture is preceded by eager
warm-up forwards whose collectives every rank runs, and two ranks built from the same flags
capture the same sizes in the same order (their collectives meet). The NCCL communicator's
collectives are left out of torch.compile's tracing.

With two GPUs (``gpu`` mark; ``benchmarks/gpu/device_run.sh parallel``): tp=2 with CUDA graphs
gives the greedy tokens of tp=2 eager and of one rank.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

infer_cuda = pytest.importorskip("infer_cuda")


class FakeComm:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def warmup(self) -> None:
        self.events.append("warmup")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.events.append("all_reduce")
        return x


def fake_cuda(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """torch.cuda's capture API as recorders: a capture shows as capture(...) ... end."""
    class Stream:
        def wait_stream(self, other: object) -> None:
            pass

    class Graph:
        def replay(self) -> None:
            events.append("replay")

    @contextlib.contextmanager
    def graph(g: object, pool: object = None, stream: object = None):
        events.append("capture")
        yield
        events.append("end")

    for name, value in {"graph_pool_handle": lambda: None, "Stream": Stream,
                        "current_stream": lambda: Stream(), "stream": lambda s: contextlib.nullcontext(),
                        "CUDAGraph": Graph, "graph": graph, "synchronize": lambda: None}.items():
        monkeypatch.setattr(torch.cuda, name, value)


def fake_model_runner(tp: int, events: list[str], layers: int = 3) -> SimpleNamespace:
    """Enough of a ModelRunner for CudaGraphRunner on the CPU: a model whose forward makes two
    all-reduces per layer, as the sharded Llama's does."""
    comm = FakeComm(events)

    def model(fwd: SimpleNamespace) -> torch.Tensor:
        events.append(f"forward bs={fwd.bs}")
        h = torch.zeros(fwd.bs, 4)
        for _ in range(layers):
            h = comm.all_reduce(h)
            h = comm.all_reduce(h)
        return h

    backend = SimpleNamespace(supports_graph_capture=True, name="fake", plan=lambda meta: None)
    return SimpleNamespace(
        model=model, attn_backend=backend, context_length=256, max_pages_per_seq=4, page_size=16,
        loaded=SimpleNamespace(ctx=SimpleNamespace(tp_size=tp, comm=comm, pipeline=None)),
        make_decode_inputs=lambda bs: SimpleNamespace(bs=bs),
        build_forward_batch=lambda d: SimpleNamespace(bs=d.bs, attn=None))


def capture_events(monkeypatch: pytest.MonkeyPatch, tp: int) -> list[str]:
    from infer.core.config.views import GraphConfig
    from infer_cuda.graph_runner import CudaGraphRunner

    events: list[str] = []
    fake_cuda(monkeypatch, events)
    runner = CudaGraphRunner(fake_model_runner(tp, events), GraphConfig(batch_sizes=[1, 4, 8]))
    runner.capture()
    assert sorted(runner.graphs) == [1, 4, 8]
    return events


def test_capture_under_tp_warms_the_communicator_and_records_the_all_reduces(monkeypatch):
    events = capture_events(monkeypatch, tp=2)
    assert events[0] == "warmup" and events.count("warmup") == 1
    captures = [i for i, e in enumerate(events) if e == "capture"]
    assert len(captures) == 3  # one per batch size, largest first
    for i, bs in zip(captures, (8, 4, 1), strict=True):
        end = events.index("end", i)
        assert events[i + 1:end] == [f"forward bs={bs}"] + ["all_reduce"] * 6
        # the eager warm-up forwards (2) before this capture ran their collectives on every rank
        before = events[:i]
        assert before[-14:] == ([f"forward bs={bs}"] + ["all_reduce"] * 6) * 2


def test_ranks_capture_the_same_collectives_in_the_same_order(monkeypatch):
    assert capture_events(monkeypatch, tp=2) == capture_events(monkeypatch, tp=2)


def test_one_rank_needs_no_communicator_set_up(monkeypatch):
    assert "warmup" not in capture_events(monkeypatch, tp=1)


def test_nccl_collectives_are_left_out_of_torch_compile_tracing():
    """Dynamo must not trace into the collectives (a graph break, then the eager NCCL call the
    CUDA graph records): calling the communicator in a compiled function runs its eager code."""
    from infer_cuda.ops.comm import NcclCommunicator

    calls: list[str] = []

    class Recording(NcclCommunicator):
        def _all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
            calls.append("eager all_gather")
            return torch.cat([x, x], dim=dim)

    comm = Recording(2, 0)

    def step(x: torch.Tensor) -> torch.Tensor:
        return comm.all_gather(x * 2, dim=0) + 1

    compiled = torch.compile(step, backend="eager")
    for _ in range(2):  # the second call runs the compiled code, again through the collective
        assert torch.equal(compiled(torch.ones(2, 3)), torch.full((4, 3), 3.0))
    assert calls == ["eager all_gather"] * 2

    def whole(x: torch.Tensor) -> torch.Tensor:  # a fresh code object: no cached compilation
        return comm.all_gather(x, dim=0)

    with pytest.raises(Exception, match="(?i)disable|skip"):  # Dynamo refuses to trace it
        torch.compile(whole, backend="eager", fullgraph=True)(torch.ones(2, 3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA GPUs")
def test_tp2_cuda_graphs_match_eager_and_one_rank(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "plugins" / "cuda" / "tests"))
    from engine_utils import greedy, make_tiny_checkpoint, random_prompts

    model = make_tiny_checkpoint(tmp_path)
    prompts = random_prompts([5, 17, 33, 9])
    one = greedy(model, prompts, 16, cuda_graph_bs=[1, 2, 4])
    graphs = greedy(model, prompts, 16, tp_size=2, cuda_graph_bs=[1, 2, 4])
    eager = greedy(model, prompts, 16, tp_size=2, disable_cuda_graph=True)
    assert graphs == eager == one
