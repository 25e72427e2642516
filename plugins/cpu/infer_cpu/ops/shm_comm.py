"""The CPU communicator: gloo, with all-reduce and all-gather through shared memory when every
rank of the group runs on this host.

A gloo all-reduce of one hidden vector costs hundreds of microseconds here (TCP over loopback
and gloo's worker threads, measured by benchmarks/comm_micro.py); a decode step makes two per
layer. Ranks on one host instead exchange through one shared-memory segment:

    header: arrived int64 [W] (the last collective each rank has written), pid int64 [W]
    data:   2 buffers x W slots x SLOT_BYTES

Collective number s (counted alike on every rank) uses buffer s % 2: rank r copies its chunk
into slot r, publishes ``arrived[r] = s`` and waits until every rank has arrived at s, then reads
all W slots (summing them in rank order 0..W-1, so every rank gets the same bits). A rank can
only write buffer s % 2 again at collective s + 2, which needs every rank to have arrived at
s + 1, i.e. to have finished reading collective s: two buffers are enough. Tensors larger than a
slot go through in slot-sized chunks.

Ordering: data is copied before ``arrived`` is stored and read after it is seen; x86-64 keeps
stores in order and loads in order (TSO), which this relies on, so the segment is used on x86-64
only (elsewhere, and across hosts, every collective is gloo's). A waiting rank yields its core,
then sleeps briefly; a peer that has exited (or, after ``TIMEOUT_S``, one that never arrives)
raises ``RuntimeError`` naming it rather than hanging.

The float32 all-reduce also exists in C (``kernels/infer_cpu_comm.c``, compiled like the other
native kernels): same segment, same collective counter (``_ShmState.seq``, shared by both), same
summation order, so both give the same bits and may interleave. ``all_reduce`` uses it for
float32 tensors when it is built; ``native_all_reduce()`` hands its address and state to the
CPU decode graph (``infer_cpu.graph``), which calls it between layers without returning to
Python. ``INFER_CPU_KERNELS=0`` or no C compiler leaves the torch path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform as host_platform
import socket
import tempfile
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from infer.core.ops.comm import ProcessGroupCommunicator

from infer_cpu.native_build import COMM_LIB_NAME, COMM_SOURCE, build, compiler, disabled

log = logging.getLogger(__name__)

SLOT_BYTES = 1 << 20
TIMEOUT_S = 300.0
_SPIN_YIELDS = 200  # sched_yield()s before sleeping between polls
_SLEEP_S = 20e-6


class _ShmState(ctypes.Structure):
    """The C ``infer_shm``: where the segment's parts are, and the collective counter."""

    _fields_ = [("arrived", ctypes.c_void_p), ("pids", ctypes.c_void_p), ("data", ctypes.c_void_p),
                ("slot_bytes", ctypes.c_int64), ("seq", ctypes.c_int64), ("world", ctypes.c_int),
                ("rank", ctypes.c_int), ("timeout_s", ctypes.c_double), ("error", ctypes.c_int),
                ("failed_rank", ctypes.c_int), ("busy_s", ctypes.c_double)]


_PEER_EXITED, _TIMEOUT = 1, 2  # infer_shm.error
_lib_lock = threading.Lock()
_lib_state: dict[str, Any] = {}


def native_library() -> ctypes.CDLL | None:
    """``infer_cpu_comm.c`` compiled for this machine, or None (kernels off, no compiler, or a
    failed build, which is logged)."""
    with _lib_lock:
        if "lib" not in _lib_state:
            lib = None
            cc = None if disabled() else compiler()
            if cc is not None:
                try:
                    lib = ctypes.CDLL(str(build(cc, COMM_SOURCE, COMM_LIB_NAME)[0]))
                    lib.infer_shm_all_reduce.argtypes = [ctypes.POINTER(_ShmState),
                                                         ctypes.c_void_p, ctypes.c_int64]
                    lib.infer_shm_all_reduce.restype = ctypes.c_int
                except (OSError, RuntimeError, AttributeError) as e:
                    log.warning("native shared-memory all-reduce unavailable: %s", e)
                    lib = None
            _lib_state["lib"] = lib
        return _lib_state["lib"]


class ShmCommunicator(ProcessGroupCommunicator):
    def __init__(self, world_size: int, rank: int, group: Any = None) -> None:
        super().__init__(world_size, rank, group)
        self._ready = world_size == 1
        self._seg: torch.Tensor | None = None
        self._state = _ShmState(world=world_size, rank=rank, timeout_s=TIMEOUT_S)

    @property
    def _seq(self) -> int:
        """The last collective through the segment (C and Python share the counter)."""
        return self._state.seq

    @_seq.setter
    def _seq(self, value: int) -> None:
        self._state.seq = value

    @property
    def uses_shared_memory(self) -> bool:
        self._setup()
        return self._seg is not None

    # -- set-up (one collective over gloo, on the first call: every rank makes it alike) -------
    def _setup(self) -> None:
        if self._ready:
            return
        self._ready = True
        here = (socket.gethostname(), host_platform.machine())
        peers: list[Any] = [None] * self.world_size
        dist.all_gather_object(peers, here, group=self.group)
        if any(p != peers[0] for p in peers) or peers[0][1] not in ("x86_64", "AMD64"):
            log.info("communicator: gloo (ranks on %s)", sorted({p[0] for p in peers}))
            return
        w = self.world_size
        nbytes = 16 * w + 2 * w * SLOT_BYTES
        name = [None]
        if self.rank == 0:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
            fd, path = tempfile.mkstemp(prefix="infer-comm-", dir=folder)
            os.ftruncate(fd, nbytes)
            os.close(fd)
            name = [path]
        dist.broadcast_object_list(name, src=dist.get_global_rank(self.group, 0)
                                   if self.group is not None else 0, group=self.group)
        seg = torch.from_file(name[0], shared=True, size=nbytes, dtype=torch.uint8)
        dist.barrier(group=self.group)
        if self.rank == 0:
            os.unlink(name[0])  # the mappings stay; nothing is left in /dev/shm
        header = seg[:16 * w].view(torch.int64).numpy()  # shares the mapping
        self._arrived, self._pids = header[:w], header[w:]
        self._pids[self.rank] = os.getpid()
        self._data = seg[16 * w:].view(2, w, SLOT_BYTES)
        self._seg = seg
        st = self._state
        st.arrived, st.pids = header.ctypes.data, header.ctypes.data + 8 * w
        st.data, st.slot_bytes = self._data.data_ptr(), SLOT_BYTES
        dist.barrier(group=self.group)  # every pid written before the first wait reads them
        log.info("communicator: shared memory (%d ranks on this host)", w)

    # -- the exchange --------------------------------------------------------------------------
    def _exchange(self, chunk: torch.Tensor) -> torch.Tensor:
        """Publish this rank's bytes ``chunk`` (uint8 [n]); returns every rank's [W, n] (a view
        of the segment, valid until the next collective but one)."""
        self._seq += 1
        seq, n = self._seq, chunk.numel()
        buf = self._data[seq % 2]
        buf[self.rank, :n].copy_(chunk)
        self._arrived[self.rank] = seq
        self._wait(seq)
        return buf[:, :n]

    def _wait(self, seq: int) -> None:
        arrived = self._arrived
        spins, start, checked = 0, None, 0.0
        while arrived.min() < seq:
            spins += 1
            if spins < _SPIN_YIELDS:
                os.sched_yield()
                continue
            time.sleep(_SLEEP_S)
            now = time.monotonic()
            start = start or now
            if now - checked > 1.0:
                checked = now
                self._check_peers(seq, now - start)

    def _check_peers(self, seq: int, waited: float) -> None:
        late = [r for r in range(self.world_size) if self._arrived[r] < seq]
        for r in late:
            if not _alive(int(self._pids[r])):
                raise RuntimeError(self._exited(r))
        if waited > TIMEOUT_S:
            raise RuntimeError(self._late(late, seq))

    def _exited(self, r: int) -> str:
        return (f"communicator: rank {r} (pid {int(self._pids[r])}) exited during a collective; "
                f"rank {self.rank} cannot go on")

    def _late(self, late: list[int], seq: int) -> str:
        return f"communicator: ranks {late} did not reach collective {seq} within {TIMEOUT_S:.0f} s"

    @property
    def native_seconds(self) -> float:
        """Time spent in the C all-reduce so far, waiting for the other ranks included, whoever
        called it (``all_reduce`` or the native decode graph); for benchmarks."""
        return self._state.busy_s

    def native_error(self) -> str:
        """Why the last native all-reduce failed (after it returned non-zero)."""
        st = self._state
        if st.error == _PEER_EXITED:
            return self._exited(st.failed_rank)
        if st.error == _TIMEOUT:
            return self._late([st.failed_rank], st.seq)
        return f"communicator: native all-reduce failed with code {st.error}"

    # -- the C all-reduce ----------------------------------------------------------------------
    def native_all_reduce(self) -> tuple[int, int] | None:
        """(address of ``infer_shm_all_reduce``, address of this communicator's state) for a
        native caller: ``int fn(state, float *x, int64_t n)`` sums x across the ranks in place
        and returns non-zero (see ``native_error``) when a peer exited or never came. None when
        the segment is not used or the C library is not built. Every rank must call this at the
        same point (the first call sets the segment up, a collective)."""
        self._setup()
        lib = native_library()
        if self._seg is None or lib is None:
            return None
        return (ctypes.cast(lib.infer_shm_all_reduce, ctypes.c_void_p).value,
                ctypes.addressof(self._state))

    def _all_reduce_native(self, lib: ctypes.CDLL, flat: torch.Tensor) -> None:
        if lib.infer_shm_all_reduce(ctypes.byref(self._state), flat.data_ptr(), flat.numel()):
            raise RuntimeError(self.native_error())

    def _usable(self, x: torch.Tensor) -> bool:
        self._setup()
        return self._seg is not None and x.device.type == "cpu"

    # -- collectives ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        if not self._usable(x) or not x.is_floating_point():
            return super().all_reduce(x)
        flat = x.reshape(-1) if x.is_contiguous() else x.contiguous().view(-1)
        lib = native_library() if x.dtype == torch.float32 else None
        if lib is not None:
            self._all_reduce_native(lib, flat)
        else:
            self._all_reduce_torch(flat)
        if flat.data_ptr() != x.data_ptr():
            x.copy_(flat.view(x.shape))
        return x

    def _all_reduce_torch(self, flat: torch.Tensor) -> None:
        """The segment's all-reduce in torch ops (any floating dtype), in place on ``flat``."""
        per = SLOT_BYTES // flat.element_size()
        for a in range(0, flat.numel(), per):
            part = flat[a:a + per]
            slots = self._exchange(part.view(torch.uint8)).view(flat.dtype)  # [W, n]
            torch.add(slots[0], slots[1], out=part)
            for r in range(2, self.world_size):
                part.add_(slots[r])

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1 or not self._usable(x) or not x.is_floating_point():
            return super().reduce_scatter(x)
        rows = x.shape[0] // self.world_size  # through the segment: all-reduce, keep our rows
        return self.all_reduce(x.clone()).narrow(0, self.rank * rows, rows)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        if not self._usable(x):
            return super().all_gather(x, dim)
        mine = x.contiguous().view(-1).view(torch.uint8)
        out = torch.empty(self.world_size, mine.numel(), dtype=torch.uint8)
        for a in range(0, mine.numel(), SLOT_BYTES):
            part = mine[a:a + SLOT_BYTES]
            out[:, a:a + part.numel()].copy_(self._exchange(part))
        parts = out.view(x.dtype).view(self.world_size, *x.shape)
        return torch.cat(parts.unbind(0), dim=dim)


def _alive(pid: int) -> bool:
    """False for an exited process, a zombie included (a killed rank its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
