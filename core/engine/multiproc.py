"""MultiprocExecutor: one process per rank, rank 0 scheduling, every rank running its shard.

Layout: the engine process is rank 0. It starts the other ranks of this node as spawned processes
(``--nnodes N`` runs ``infer serve --node-rank r`` on every other node, which starts that node's
ranks and nothing else). All ranks join one torch.distributed group with ``platform.dist_backend``
at ``--dist-init-addr`` (a free local port when unset); the model's collectives (tensor-parallel
all-reduce and all-gather, expert dispatch) run in it.

Per step rank 0 turns the ScheduleBatch into ``StepInputs`` (plain host values), publishes them on
a ZMQ PUB socket that every other rank subscribes to, and runs its own shard; the others run
theirs on the same inputs. Rank 0 alone samples (the LM head gathers the full vocabulary on every
rank). The inputs travel as one pickled message: a decode step of 32 sequences is a few kB.

Overlap scheduling: a deferred step's sampled ids stay on rank 0's device, and the next step's
inputs name them by placeholder (``-(row + 1)``, see ``ModelRunner``), which every rank resolves
from its future-token buffer. So the message also says how many ids the step samples when it is
deferred; after their forward every rank joins one broadcast of those ids from rank 0 over the
process group (on the device stream: NCCL's is asynchronous, so rank 0 does not wait for it), into
their own buffer. Steps that are not deferred broadcast nothing.

Faults: a rank that dies makes the others' collectives fail; rank 0 also watches its children
and ends its process (exit code 1) when one exits, so the server sees a dead engine and answers
503. A rank whose publisher disconnects (rank 0 gone) exits. Children are killed when rank 0 exits.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import zmq
from infer.core.config.views import EngineConfig
from infer.core.engine import gc_watch
from infer.core.engine.executor import Executor, pool_pages
from infer.core.engine.model_runner import LaunchedStep, ModelRunner, StepInputs, StepResult
from infer.core.engine.scheduler import ScheduleBatch

log = logging.getLogger(__name__)

_STOP = b"stop"
_SYNC = b"sync"  # sent until every rank has joined the channel (PUB drops what is sent before)


def free_port() -> int:
    """A local port that is free, with the one above it free too (the step channel's)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise OSError("no free pair of adjacent local ports")


def init_addresses(cfg: EngineConfig) -> tuple[str, int]:
    """(host, port) of the torch.distributed rendezvous; the step channel uses port + 1."""
    addr = cfg.parallel.dist_init_addr
    if addr:
        host, _, port = addr.rpartition(":")
        return host or "127.0.0.1", int(port)
    return "127.0.0.1", free_port()


class RankProcess:
    """What every rank does: join the group, load its shard, size its pool."""

    def __init__(self, cfg: EngineConfig, platform_name: str, rank: int, host: str, port: int,
                 platform: Any = None, store: Any = None) -> None:
        p = cfg.parallel
        self.cfg, self.rank, self.world = cfg, rank, p.world_size
        if platform is None:
            from infer.core.plugins import get_plugin_host

            platform = get_plugin_host().select(platform_name)
        self.platform = platform
        first, slots = p.local_slot
        platform.bind_local_rank(first + rank % (self.world // p.nnodes), slots)
        timeout = timedelta(seconds=p.dist_timeout or 600)
        if store is None:  # ranks 1..: clients of rank 0's rendezvous store
            store = dist.TCPStore(host, port, self.world, is_master=False, timeout=timeout)
        dist.init_process_group(platform.dist_backend, store=store, world_size=self.world,
                                rank=rank, timeout=timeout)
        from infer.core.model.loader import load_model

        tp_rank, pp_rank = rank % p.tp_size, rank // p.tp_size
        group = None
        if p.pp_size > 1 and p.tp_size > 1:  # one tensor-parallel group per pipeline stage
            groups = [dist.new_group(list(range(s * p.tp_size, (s + 1) * p.tp_size)))
                      for s in range(p.pp_size)]
            group = groups[pp_rank]
        self.loaded = load_model(cfg.load.model_path, platform=platform, progress=rank == 0,
                                 tp_size=p.tp_size, tp_rank=tp_rank, ep_size=p.ep_size,
                                 comm_group=group, pp_size=p.pp_size, pp_rank=pp_rank,
                                 **cfg.load.load_kwargs())

    def kv_pages(self) -> int:
        """This rank's page budget, then the smallest over all ranks (every rank calls this)."""
        mine = pool_pages(self.cfg.cache, self.loaded, self.platform.memory_available())
        t = torch.tensor([mine], dtype=torch.int64, device=self.platform.torch_device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


def _worker_main(cfg: EngineConfig, platform_name: str, rank: int, host: str, port: int) -> None:
    """Entry of ranks 1..W-1: serve steps from rank 0 until told to stop or rank 0 is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the process group's Ctrl-C is rank 0's to handle
    gc_watch.pause_for_startup()  # until freeze_startup_heap, below
    gc_watch.install_warning(cfg.gc_warning_threshold_secs, f"rank {rank}")
    rp = RankProcess(cfg, platform_name, rank, host, port)
    runner = ModelRunner(rp.loaded, cfg, rp.kv_pages(), rp.platform, None)
    gc_watch.freeze_startup_heap()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sub.connect(f"tcp://{host}:{port + 1}")
    while sub.recv() != _SYNC:
        pass
    dist.barrier()  # this rank receives what rank 0 publishes from now on
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    try:
        while True:
            events = dict(poller.poll())
            if sub not in events:  # only a disconnect, with nothing left to read: rank 0 is gone
                log.error("rank %d: rank 0 disconnected; exiting", rank)
                os._exit(1)
            msg = sub.recv()  # messages first: rank 0's STOP may arrive with its disconnect
            if msg == _STOP:
                break
            if msg != _SYNC:
                inputs, deferred = pickle.loads(msg)
                runner.forward(inputs)
                if deferred:
                    receive_future_ids(runner, deferred)
    finally:
        ctx.destroy(linger=0)
        dist.destroy_process_group()


def receive_future_ids(runner: ModelRunner, n: int) -> None:
    """Ranks 1..: rank 0's ``n`` sampled ids of a deferred step, into this rank's future-token
    buffer (what the next step's placeholders read)."""
    ids = torch.empty(n, dtype=torch.int64, device=runner.device)
    dist.broadcast(ids, src=0)
    runner._future = ids


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies (Linux)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn_rank(cfg: EngineConfig, platform_name: str, rank: int, host: str, port: int
               ) -> subprocess.Popen:
    """Start rank ``rank`` as a fresh interpreter (``python -m infer.core.engine.multiproc``),
    its arguments pickled on its stdin. A new interpreter rather than a multiprocessing child:
    the server's engine process is itself a daemonic child, which may not have children."""
    proc = subprocess.Popen([sys.executable, "-m", "infer.core.engine.multiproc"],
                            stdin=subprocess.PIPE, preexec_fn=_die_with_parent)
    proc.stdin.write(pickle.dumps((cfg, platform_name, rank, host, port)))
    proc.stdin.close()
    return proc


def run_node(cfg: EngineConfig, platform_name: str) -> int:
    """``--node-rank`` > 0: start this node's ranks and wait for them (no scheduler, no HTTP)."""
    host, port = init_addresses(cfg)
    p = cfg.parallel
    per_node = p.world_size // p.nnodes
    procs = [spawn_rank(cfg, platform_name, r, host, port)
             for r in range(p.node_rank * per_node, (p.node_rank + 1) * per_node)]
    codes = [proc.wait() for proc in procs]
    return 0 if all(c == 0 for c in codes) else 1


class MultiprocExecutor(Executor):
    def __init__(self, cfg: EngineConfig, platform: Any) -> None:
        self.cfg = cfg
        p = cfg.parallel
        host, port = init_addresses(cfg)
        # Both ports are taken before any rank starts: a local Ray, started by _start_ranks,
        # binds ports of its own and could take a port chosen free but not yet bound.
        self.zmq = zmq.Context()
        self.pub = self.zmq.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(f"tcp://{'*' if p.nnodes > 1 or self.remote_ranks else host}:{port + 1}")
        store = dist.TCPStore(host, port, p.world_size, is_master=True,
                              timeout=timedelta(seconds=p.dist_timeout or 600),
                              wait_for_workers=False)
        self.procs = self._start_ranks(cfg, platform, host, port)
        self._stopping = False
        self._watch = threading.Thread(target=self._watch_children, daemon=True)
        self._watch.start()
        self.rank0 = RankProcess(cfg, platform.name, 0, host, port, platform=platform, store=store)
        self.loaded = self.rank0.loaded
        self.runner: ModelRunner | None = None
        self.publish_seconds = 0.0  # time spent handing inputs to the other ranks (benchmarks)
        self.steps = 0

    remote_ranks = False  # ranks may run on other hosts (bind the step channel on every address)

    def _start_ranks(self, cfg: EngineConfig, platform: Any, host: str, port: int) -> list[Any]:
        """Start ranks 1.. of this node; each handle has ``poll()``, ``kill()``, ``wait(timeout)``
        and ``pid`` (subprocess.Popen's)."""
        per_node = cfg.parallel.world_size // cfg.parallel.nnodes
        return [spawn_rank(cfg, platform.name, r, host, port) for r in range(1, per_node)]

    def _watch_children(self) -> None:
        """A rank that exits while rank 0 runs leaves collectives that can never finish: end this
        process (the server reports the dead engine) rather than hang."""
        while True:
            for proc in self.procs:
                if proc.poll() is not None and not self._stopping:
                    log.error("rank process %s exited with code %s; stopping the engine",
                              proc.pid, proc.returncode)
                    for other in self.procs:
                        if other.poll() is None:
                            other.kill()
                    os._exit(1)
            time.sleep(0.2)

    def kv_pages(self) -> int:
        return self.rank0.kv_pages()

    def start(self, num_pages: int, grammar: Any) -> None:
        self.runner = ModelRunner(self.loaded, self.cfg, num_pages, self.rank0.platform, grammar)
        joined = dist.barrier(async_op=True)  # completes once every rank has seen a SYNC
        while not joined.is_completed():
            self.pub.send(_SYNC)
            time.sleep(0.005)
        joined.wait()

    def _publish(self, inputs: StepInputs, deferred: int = 0) -> None:
        """Hand a step's inputs to the other ranks; ``deferred``: the number of ids the step
        samples when it is deferred (the other ranks then join their broadcast), else 0."""
        t = time.perf_counter()
        self.pub.send(pickle.dumps((inputs, deferred), protocol=pickle.HIGHEST_PROTOCOL))
        self.publish_seconds += time.perf_counter() - t
        self.steps += 1

    def launch(self, batch: ScheduleBatch, defer: bool) -> LaunchedStep:
        n = sum(s.num_sample for s in batch.seqs) if defer else 0
        step = self.runner.launch(batch, defer, publish=lambda x: self._publish(x, n))
        if n:  # the ids the next step's placeholders name, to every rank's buffer
            assert len(step.reqs) == n, (len(step.reqs), n)
            dist.broadcast(self.runner._future[:n], src=0)
        return step

    def resolve(self, step: LaunchedStep) -> StepResult:
        return self.runner.resolve(step)

    def forget(self, rid: str) -> None:
        self.runner.forget(rid)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            self.pub.send(_STOP)
            for proc in self.procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
            self.zmq.destroy(linger=0)
            if dist.is_initialized():
                dist.destroy_process_group()


if __name__ == "__main__":
    _worker_main(*pickle.loads(sys.stdin.buffer.read()))
