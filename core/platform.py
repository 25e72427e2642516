"""What a device plugin hands the core: probe results, device info and the Platform object.

The core asks a Platform for capabilities and implementations; it never asks which device it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infer.core.support import SupportMatrix


@dataclass(frozen=True)
class DeviceInfo:
    """One kind of device that a probe found."""

    kind: str  # platform name: cpu, cuda, rocm, ascend, hpu
    generation: str  # support-matrix column: sm90, gfx942, A2, gaudi2, amx, avx512, arm, ...
    name: str  # human-readable model name
    memory_bytes: int  # memory of one device
    count: int = 1
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeResult:
    """What a probe reports. ``found`` False comes with the reason in ``reason``."""

    platform: str
    found: bool
    reason: str = ""
    device: DeviceInfo | None = None
    is_accelerator: bool = True

    @classmethod
    def not_found(cls, platform: str, reason: str, is_accelerator: bool = True) -> ProbeResult:
        return cls(platform=platform, found=False, reason=reason, is_accelerator=is_accelerator)


@dataclass(frozen=True)
class SettingAdjustment:
    """A default that a platform changed because the user left the setting unset."""

    name: str  # ServerArgs field name
    value: Any
    reason: str


class Platform:
    """The active device platform. Plugins subclass this; one instance is active per process.

    Attributes a subclass sets: ``name`` (platform name), ``torch_device`` (torch device type
    string), ``dist_backend`` (torch.distributed backend), ``info`` (DeviceInfo).
    """

    name: str = ""
    torch_device: str = "cpu"
    dist_backend: str = "gloo"
    default_attention_backend: str = "torch_native"
    default_graph_runner: str | None = None
    # Seconds the server's engine process pauses after a step that produced only first tokens
    # (streamed, with decode steps to follow; server/engine_proc.py says exactly when), before
    # its next step: where the forward occupies every core of the host, the HTTP process (and a
    # client on the same host) otherwise waits for a core while the next step runs, and the
    # first token reaches the client that much later. 0: no pause (a device runs the forward;
    # the host's cores stay free).
    first_token_handoff_s: float = 0.0

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info
        self._matrix: SupportMatrix | None = None

    @property
    def generation(self) -> str:
        return self.info.generation

    def bind_matrix(self, matrix: SupportMatrix) -> None:
        self._matrix = matrix

    def supports(self, flag: str, value: Any = None) -> bool:
        """Whether ``flag`` (or ``flag=value``) is supported or experimental on this generation."""
        if self._matrix is None:
            raise RuntimeError("platform has no support matrix bound")
        return self._matrix.lookup(self.name, self.generation, flag, value).status.runs

    def memory_available(self) -> int:
        """Bytes of device memory free for weights and KV cache on one device."""
        return self.info.memory_bytes

    def max_local_ranks(self) -> int:
        """How many ranks of a multi-rank executor this host can run (one per device)."""
        return self.info.count

    def ray_resources(self) -> dict[str, float]:
        """The Ray resources one rank needs (its bundle in the placement group)."""
        return {"CPU": 1}

    def bind_local_rank(self, local_rank: int, local_world_size: int) -> None:
        """This process is rank ``local_rank`` of ``local_world_size`` ranks on this host (called
        by a multi-rank executor before the process group forms): use device ``local_rank``, or,
        where the ranks share one device (the host CPU), take a share of it."""

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on synchronous devices)."""

    def to_device(self, t: Any) -> Any:
        """Host tensor -> device tensor. Asynchronous devices override this so that the copy
        never waits for queued device work (overlap scheduling launches the next step's inputs
        while the device still runs the last one)."""
        return t.to(self.torch_device)

    def to_host_async(self, t: Any) -> tuple[Any, Any]:
        """Start copying a device tensor to the host: ``(host tensor, wait)`` where ``wait()``
        blocks until the copy landed, or is None when the copy is already done."""
        return t.cpu(), None

    def cache_zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zeroed tensor on this platform's device for a large buffer that lives as long as the
        engine (each layer's keys or values). Platforms may place it where their kernels read it
        best (the CPU plugin: on transparent huge pages); it holds zeros either way."""
        import torch

        return torch.zeros(shape, dtype=dtype, device=self.torch_device)

    def greedy_ids(self, logits: Any) -> Any:
        """Greedy sampling's ids: ``logits [B, V] -> [B]`` int64, exactly ``logits.argmax(dim=-1)``
        (the first maximum; a NaN counts as the maximum). Platforms with a faster kernel for it
        override this; the result must not differ."""
        return logits.argmax(dim=-1)

    def gguf_kv_dtype(self, model_dtype: Any) -> Any:
        """The KV cache dtype of a GGUF file served under ``--dtype auto`` and ``--kv-cache-dtype
        auto`` ("the model's dtype"; a GGUF file has none of its own). The model runs
        ``model_dtype`` (float32: its dequantised weights); a platform whose attention reads a
        16-bit cache may store one (SGLang's auto runs a float32 model, cache included, in
        FP16; llama.cpp's default cache is f16)."""
        return model_dtype

    def default_adjustments(self, args: Any) -> list[SettingAdjustment]:
        """Defaults for settings the user left unset; each returned change is applied and logged."""
        return []
