"""The CUDA platform object: device info, per-SM defaults and memory queries."""

from __future__ import annotations

import importlib.util
from typing import Any

from infer.core.platform import DeviceInfo, Platform, ProbeResult, SettingAdjustment


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def default_attention_backend(generation: str) -> str:
    """sm90/sm100: flashinfer when installed, else our Triton kernels; elsewhere Triton."""
    if generation in ("sm90", "sm100") and flashinfer_available():
        return "flashinfer"
    return "triton"


class CudaPlatform(Platform):
    name = "cuda"
    torch_device = "cuda"
    dist_backend = "nccl"
    default_graph_runner = "cuda_graph"

    def __init__(self, info: DeviceInfo) -> None:
        super().__init__(info)
        self.default_attention_backend = default_attention_backend(info.generation)

    def memory_available(self) -> int:
        """Free device memory plus what this process's caching allocator already holds (its
        weights among it): the bytes the engine may spend on weights and KV cache."""
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free) + int(torch.cuda.memory_reserved())

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def ray_resources(self) -> dict[str, float]:
        return {"CPU": 1, "GPU": 1}

    def bind_local_rank(self, local_rank: int, local_world_size: int) -> None:
        import torch

        torch.cuda.set_device(local_rank)

    def to_device(self, t: Any) -> Any:
        # through pinned memory: a copy from pageable memory may synchronize with the stream
        return t.pin_memory().to("cuda", non_blocking=True)

    def to_host_async(self, t: Any) -> tuple[Any, Any]:
        import torch

        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done.synchronize

    def default_adjustments(self, args: Any) -> list[SettingAdjustment]:
        out = []
        if getattr(args, "attention_backend", "unset") is None:
            backend, why = self.default_attention_backend, f"default attention backend on {self.generation}"
            if backend == "flashinfer" and str(getattr(args, "kv_cache_dtype", "auto")).startswith("fp8"):
                backend, why = "triton", "an fp8 KV cache runs on the Triton kernels (flashinfer refuses it)"
            elif backend == "flashinfer" and getattr(args, "enable_piecewise_cuda_graph", False):
                backend, why = "triton", ("prefill CUDA graphs (--enable-piecewise-cuda-graph) capture "
                                          "the Triton kernels (flashinfer plans prefill on the host)")
            out.append(SettingAdjustment("attention_backend", backend, why))
        return out


def create_platform(result: ProbeResult) -> Platform:
    assert result.device is not None
    return CudaPlatform(result.device)
