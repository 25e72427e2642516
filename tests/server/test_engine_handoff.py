"""The engine loop's pause after first tokens (``Platform.first_token_handoff_s``): taken after a
step whose outputs are all first tokens, one at least of a streamed request, when the next step
only decodes; never after a step that also streamed later tokens, after a request's only token,
after first tokens that no client streams, when the loop has nothing left to run, while a prompt
waits (queued, part-way through a chunked prefill, or unread on the socket), or where the
platform sets no pause."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import zmq
from infer.server import engine_proc


def _out(rid: str, done: int, new: int = 1, finished: bool = False) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, new_token_ids=[7] * new, finished=finished, finish_reason=None,
                           prompt_tokens=4, completion_tokens=done, cached_tokens=0,
                           output_logprobs=None, output_top_logprobs=None, prompt_logprobs=None,
                           prompt_top_logprobs=None)


class _Core:
    """Runs the given steps' outputs, one list a step; has work until the last step is done; a
    prompt is pending after the steps whose (1-based) numbers are in ``prefill_after``."""

    def __init__(self, steps: list[list[SimpleNamespace]], handoff_s: float,
                 prefill_after: frozenset[int] = frozenset()) -> None:
        self.steps = list(steps)
        self.streamed: set[str] = set()  # added with stream=True, not yet finished
        self.total = len(steps)
        self.prefill_after = prefill_after
        self.platform = SimpleNamespace(first_token_handoff_s=handoff_s)
        self.loop: engine_proc._EngineLoop | None = None

    def has_work(self) -> bool:
        return bool(self.steps)

    def step(self) -> list[SimpleNamespace]:
        outs = self.steps.pop(0)
        self.streamed -= {o.rid for o in outs if o.finished}
        if not self.steps:
            assert self.loop is not None
            self.loop.stopping = True
        return outs

    def prefill_pending(self) -> bool:
        return self.total - len(self.steps) in self.prefill_after

    def abort(self, rid: str) -> None:
        pass

    def make_request(self, rid: str, *args, stream: bool = False, **kwargs) -> SimpleNamespace:
        return SimpleNamespace(rid=rid, stream=stream)

    def add_request(self, req: SimpleNamespace) -> list[str]:
        if req.stream:
            self.streamed.add(req.rid)
        return [req.rid]

    def streams(self, rid: str) -> bool:
        return rid in self.streamed

    def stats(self) -> dict:
        return {}


def _run(steps: list[list[SimpleNamespace]], handoff_s: float, monkeypatch,
         prefill_after: frozenset[int] = frozenset(), unread_after: int = 0,
         not_streamed: frozenset[str] = frozenset()) -> list[tuple[int, float]]:
    """The pauses the loop took, as (steps run before it, seconds). Every request of ``steps``
    arrives as an AddRequest before the loop starts, streamed unless in ``not_streamed``;
    ``unread_after``: a message reaches the engine's socket during that step (an abort of an
    unknown request)."""
    core = _Core(steps, handoff_s, prefill_after)
    total = len(steps)
    pauses: list[tuple[int, float]] = []
    monkeypatch.setattr(engine_proc.time, "sleep",
                        lambda s: pauses.append((total - len(core.steps), s)))
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)  # the loop's two sockets
    sender, sink = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)  # the HTTP process's ends
    pull.bind("inproc://handoff-in")
    sender.connect("inproc://handoff-in")
    sink.bind("inproc://handoff-out")
    push.connect("inproc://handoff-out")
    for rid in dict.fromkeys(o.rid for step in steps for o in step):
        sender.send_pyobj(engine_proc.ipc.AddRequest(rid, [1, 2, 3, 4], None,
                                                     stream=rid not in not_streamed))
    assert pull.poll(5000)  # the requests are on the loop's socket
    if unread_after:
        step = core.step

        def step_then_message() -> list[SimpleNamespace]:
            outs = step()
            if total - len(core.steps) == unread_after:
                sender.send_pyobj(engine_proc.ipc.AbortRequest("nobody"))
                assert pull.poll(5000)
            return outs

        core.step = step_then_message
    try:
        core.loop = engine_proc._EngineLoop(core, pull, push, watchdog_s=0)
        core.loop.run()
    finally:
        for sock in (push, pull, sender, sink):
            sock.close(linger=0)
        ctx.term()
    return pauses


def test_pause_after_first_tokens_with_steps_to_follow(monkeypatch):
    steps = [[_out("a", 1)], [_out("a", 2)], [_out("b", 1), _out("c", 1)],
             [_out("a", 3), _out("b", 2), _out("c", 2)],
             [_out("a", 4, finished=True), _out("b", 3, finished=True), _out("c", 3, finished=True)]]
    assert _run(steps, 0.002, monkeypatch) == [(1, 0.002), (3, 0.002)]


def test_no_pause_after_a_step_that_also_streamed_later_tokens(monkeypatch):
    steps = [[_out("a", 2), _out("b", 1)], [_out("a", 3), _out("b", 2)],
             [_out("a", 4, finished=True), _out("b", 3, finished=True)]]
    assert _run(steps, 0.002, monkeypatch) == []


def test_no_pause_after_later_tokens_an_only_token_or_the_last_step(monkeypatch):
    steps = [[_out("a", 3, new=2)],  # two tokens at once, not the first
             [_out("b", 1, finished=True)],  # the request's only token: it is done
             [_out("c", 5)], [_out("d", 1)]]  # a first token in the loop's last step
    assert _run(steps, 0.002, monkeypatch) == []


def test_no_pause_while_a_prompt_waits(monkeypatch):
    steps = [[_out("a", 1)], [_out("b", 1)], [_out("a", 2), _out("b", 2)],
             [_out("a", 3, finished=True), _out("b", 3, finished=True)]]
    assert _run(steps, 0.002, monkeypatch, prefill_after=frozenset({1})) == [(2, 0.002)]
    assert _run(steps, 0.002, monkeypatch, prefill_after=frozenset({2})) == [(1, 0.002)]


def test_no_pause_while_a_message_is_unread(monkeypatch):
    steps = [[_out("a", 1)], [_out("b", 1)], [_out("a", 2, finished=True),
                                              _out("b", 2, finished=True)]]
    assert _run(steps, 0.002, monkeypatch, unread_after=1) == [(2, 0.002)]


def test_pause_only_for_first_tokens_a_client_streams(monkeypatch):
    steps = [[_out("a", 1), _out("b", 1)], [_out("a", 2), _out("b", 2)], [_out("c", 1)],
             [_out("a", 3, finished=True), _out("b", 3, finished=True), _out("c", 2, finished=True)]]
    assert _run(steps, 0.002, monkeypatch, not_streamed=frozenset("ac")) == [(1, 0.002)]
    assert _run(steps, 0.002, monkeypatch, not_streamed=frozenset("ab")) == [(3, 0.002)]


@pytest.mark.parametrize("handoff_s", [0.0, None])
def test_no_pause_where_the_platform_sets_none(monkeypatch, handoff_s):
    steps = [[_out("a", 1)], [_out("a", 2, finished=True)]]
    assert _run(steps, handoff_s, monkeypatch) == []


def test_the_cpu_platform_pauses():
    from infer_cpu.probe import CpuPlatform

    assert 0 < CpuPlatform.first_token_handoff_s <= 0.002
