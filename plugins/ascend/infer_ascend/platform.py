"""The Ascend platform object: device info from torch.npu, HCCL, defaults, memory, streams.

torch_npu is imported only here and in the ops (never by the entry point or the probe): importing
it initialises the CANN runtime. After ``import torch_npu`` the ``torch.npu`` namespace mirrors
``torch.cuda`` (device_count, get_device_name, mem_get_info, Stream, Event, NPUGraph).
"""

from __future__ import annotations

import logging
from typing import Any

from infer.core.platform import DeviceInfo, Platform, ProbeResult, SettingAdjustment

from infer_ascend.probe import ascend_generation, soc_version_from_name

log = logging.getLogger(__name__)

PAGE_SIZE = 128  # PageAttention block sizes are multiples of 128 in [128, 512]


def npu() -> Any:
    """The ``torch.npu`` namespace (importing torch_npu registers it)."""
    import torch
    import torch_npu  # noqa: F401

    return torch.npu


def generation_from_device_name(name: str) -> str | None:
    """``torch.npu.get_device_name()`` ("Ascend910B3", "Ascend910_9391") -> "A2" / "A3"."""
    version = soc_version_from_name(name)
    return None if version is None else ascend_generation(version)


class AscendPlatform(Platform):
    name = "ascend"
    torch_device = "npu"
    dist_backend = "hccl"
    default_attention_backend = "ascend"
    default_graph_runner = "acl_graph"
    pin_host_memory = True  # host staging buffers in page-locked memory (async copies)

    def device_info(self) -> DeviceInfo:
        """Device info read from torch.npu (needs the ACL context the probe avoids): count,
        chip name, memory of one device, and the generation from the chip name."""
        n = npu()
        name = n.get_device_name(0)
        gen = generation_from_device_name(name)
        if gen is None:
            raise RuntimeError(f"torch.npu reports {name!r}, which is neither an A2 (910B) nor an "
                               f"A3 (910_93xx) SoC")
        _free, total = n.mem_get_info()
        return DeviceInfo(kind="ascend", generation=gen, name=name, memory_bytes=int(total),
                          count=int(n.device_count()), details=dict(self.info.details))

    def memory_available(self) -> int:
        """Free device memory plus what this process's caching allocator already holds. The
        first call (the engine sizing its KV cache) replaces the probe's info, which has no
        memory figures, with ``device_info()``; a generation that disagrees with the probe's is
        an error (the support matrix was checked against the probe's)."""
        if not self.info.memory_bytes:
            info = self.device_info()
            if info.generation != self.info.generation:
                raise RuntimeError(f"torch.npu reports {info.name} ({info.generation}) but the "
                                   f"probe found {self.info.name} ({self.info.generation})")
            self.info = info
        n = npu()
        free, _total = n.mem_get_info()
        return int(free) + int(n.memory_reserved())

    def synchronize(self) -> None:
        npu().synchronize()

    def bind_local_rank(self, local_rank: int, local_world_size: int) -> None:
        """One NPU per rank: rank i of this host uses device i (before HCCL forms its group)."""
        n = npu()
        if local_rank >= n.device_count():
            raise RuntimeError(f"rank {local_rank} of {local_world_size} on this host needs NPU "
                               f"{local_rank}, but torch.npu sees {n.device_count()}")
        n.set_device(local_rank)

    def ray_resources(self) -> dict[str, float]:
        return {"CPU": 1, "NPU": 1}

    def _staging(self, t: Any) -> Any:
        return t.pin_memory() if self.pin_host_memory else t

    def to_device(self, t: Any) -> Any:
        """Host -> NPU without waiting for queued work (from page-locked memory)."""
        return self._staging(t).to(self.torch_device, non_blocking=True)

    def to_host_async(self, t: Any) -> tuple[Any, Any]:
        """Queue the NPU -> host copy behind the current stream's work; ``wait`` syncs on an event
        recorded after it."""
        import torch

        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin_host_memory)
        host.copy_(t, non_blocking=True)
        done = npu().Event()
        done.record()
        return host, done.synchronize

    def default_adjustments(self, args: Any) -> list[SettingAdjustment]:
        out = []
        if getattr(args, "page_size", None) in (None, 1):
            out.append(SettingAdjustment(
                "page_size", PAGE_SIZE, "Ascend PageAttention (npu_fused_infer_attention_score) "
                "takes KV blocks of a multiple of 128 tokens; SGLang uses 128 on NPUs"))
        if getattr(args, "attention_backend", "unset") is None:
            out.append(SettingAdjustment("attention_backend", "ascend",
                                         "the torch_npu attention backend"))
        return out


def create_platform(result: ProbeResult) -> Platform:
    assert result.device is not None
    return AscendPlatform(result.device)
