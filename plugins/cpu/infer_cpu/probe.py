"""CPU probe: ISA generation from /proc/cpuinfo (or the machine type), memory from the OS."""

from __future__ import annotations

import os
import platform as _pyplatform
from typing import Any

from infer.core.platform import DeviceInfo, Platform, ProbeResult, SettingAdjustment

from infer_cpu import hugepages, native_build


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _pyplatform.processor() or _pyplatform.machine()


def cpu_generation(machine: str | None = None, flags: set[str] | None = None) -> str:
    """amx (AMX tiles with bf16), avx512, avx2, arm, or x86_64 (none of those)."""
    machine = machine or _pyplatform.machine()
    if machine.lower() in ("aarch64", "arm64"):
        return "arm"
    flags = _cpu_flags() if flags is None else flags
    if "amx_bf16" in flags and "amx_tile" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "x86_64"


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def available_memory() -> int | None:
    """The kernel's MemAvailable in bytes, or None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def probe() -> ProbeResult:
    gen = cpu_generation()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = DeviceInfo(kind="cpu", generation=gen, name=_cpu_name(), memory_bytes=_memory_bytes(),
                      count=1, details={"cores": cores or 1,
                                        "native_kernels": native_build.describe(),
                                        "huge_pages": hugepages.describe()})
    return ProbeResult(platform="cpu", found=True, device=info, is_accelerator=False)


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class CpuPlatform(Platform):
    name = "cpu"
    torch_device = "cpu"
    dist_backend = "gloo"
    default_attention_backend = "torch_native"
    default_graph_runner = "native_decode"  # infer_cpu.graph: whole decode stack in one call
    # The native forward runs a thread on every core it may use, so the decode step after a
    # first token holds the cores the HTTP process needs to send that token on, and it waited
    # for most of that step. A pause of 0.5 ms lets it through first: the bf16 SmolLM2 served to
    # one client (``infer bench serving``, 128 in / 128 out, 16-24 requests, on / off servers
    # alternating, 2-core Intel Xeon with AMX) had a median time to first token of 27-30 ms
    # with it against 30-36 ms without, in six pairs; a request whose only token is its first
    # (max_tokens 1: no step after it) took 26.5-27 ms. At 4 and 32 clients the pause is rarely
    # taken (engine_proc: only after steps of streamed first tokens alone, with no prompt
    # waiting) and the rows did not move beyond the machine's noise.
    first_token_handoff_s = 0.0005

    _share = 1  # ranks of a multi-rank executor on this host: they split its memory and cores

    def memory_available(self) -> int:
        avail = available_memory()
        return (avail if avail is not None else self.info.memory_bytes) // self._share

    def max_local_ranks(self) -> int:
        """Ranks share the host: at most one per core this process may use."""
        return _usable_cores()

    def bind_local_rank(self, local_rank: int, local_world_size: int) -> None:
        """Ranks on one host share its memory and its cores: each takes an equal share of both
        (threads: the cores this process may use, divided among the local ranks)."""
        import torch

        self._share = local_world_size
        torch.set_num_threads(max(1, _usable_cores() // local_world_size))

    def cache_zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """The KV cache on transparent huge pages (``infer_cpu.hugepages``): a decode step's
        attention reads each sequence's keys and values scattered over the cache, and on 4 KB
        pages nearly every row it reads walks the page tables."""
        from infer_cpu import hugepages

        return hugepages.zeros(shape, dtype)

    def greedy_ids(self, logits: Any) -> Any:
        """The native argmax (``infer_cpu.kernels.argmax_rows``) where it takes the logits: 32
        rows of SmolLM2's vocabulary in a fraction of a millisecond, where torch's argmax took
        3.8 ms of a 35-50 ms decode step (5 % of the bf16 engine's samples at 32 clients)."""
        from infer_cpu import kernels

        ids = kernels.argmax_rows(logits)
        return ids if ids is not None else super().greedy_ids(logits)

    def gguf_kv_dtype(self, model_dtype: Any) -> Any:
        """An fp16 cache for a GGUF file's float32 model where the native attention reads it
        (``infer_cpu.kernels``: widened exactly as loaded, F16C). Half the bytes of a float32
        cache, which the decode attention of a batch is bound by (the default model's 32-row
        decode call 1.14x, ``benchmarks/cpu_engine_steps.py``), and its answers stay within the default's quality bar (mean KL
        against the float32 cache below 1e-6, ``infer bench quality``); bf16's shorter mantissa
        misses it (3.3e-5). ``--dtype float32 --quantization gguf`` keeps a float32 cache."""
        import torch

        from infer_cpu import kernels

        if model_dtype == torch.float32 and kernels.load() is not None:
            return torch.float16
        return model_dtype

    def default_adjustments(self, args: Any) -> list[SettingAdjustment]:
        # The forward runs on the host thread: there is no queued device work for scheduling
        # to overlap with, only the extra discarded row per stopped request.
        out = [SettingAdjustment("disable_overlap_schedule", True,
                                 "the CPU forward runs on the host thread; nothing to overlap with")]
        out += _prefill_pacing(args)
        return out


# Prefill tokens per step on the CPU. A CPU GEMM is near its peak from a few hundred rows, so a
# 4,096-token step is no faster per token than eight 512-token steps, but it holds every running
# request's next token (and every waiting request's first token) until all of it is done. Small
# chunks mixed with the running decodes let first tokens come out request by request (vLLM's CPU
# server does the same with 2,048 tokens per step, decodes included). Each step also pays one pass
# over the weights, which is what keeps the chunk from being smaller still.
CPU_PREFILL_CHUNK = 512
# A GGUF model's chunk: its prompt tokens cost about twice a bf16 model's (the integer GEMMs'
# block scales) and its pass over the Q4 weights about a third, so half the chunk keeps a step's
# time and its fixed share near a bf16 model's at 512. Served (SmolLM2's Q4_1 GGUF, Intel Xeon
# with AMX, 2 cores, six alternating rounds against 512): median first token 0.63x at 8 clients
# and 0.52x at 32, output 0.95x at 8 and 1.09x at 32; a bf16 folder at 256 gained first tokens
# too (0.71-0.78x) but lost 1.5-3 % of its 32-client output to the extra weight passes
# (benchmarks/cpu_vllm_notes.md, session 42).
CPU_GGUF_PREFILL_CHUNK = 256


def serves_gguf(args: Any) -> bool:
    """Whether ``--model-path`` names a GGUF model, told without fetching anything: a .gguf file,
    a folder whose weights are one (``resolve_source``'s order), the default model's alias, or
    ``--load-format gguf``. A hub id that is not local counts as not GGUF."""
    from pathlib import Path

    from infer.core.model.loader.default_model import DEFAULT_MODELS
    from infer.core.model.loader.source import ModelSourceError, resolve_source

    fmt = getattr(args, "load_format", None) or "auto"
    path = getattr(args, "model_path", None)
    if fmt == "gguf":
        return True
    if fmt != "auto" or not path:
        return False
    if path in DEFAULT_MODELS and not Path(path).exists():
        return DEFAULT_MODELS[path].filename.endswith(".gguf")
    if not Path(path).expanduser().exists():
        return False
    try:
        return resolve_source(path, fmt).load_format == "gguf"
    except ModelSourceError:
        return False


def _prefill_pacing(args: Any) -> list[SettingAdjustment]:
    """Small prefill chunks mixed with decodes, where the settings allow both."""
    out = []
    page = getattr(args, "page_size", None) or 1
    gguf = serves_gguf(args)
    chunk = CPU_GGUF_PREFILL_CHUNK if gguf else CPU_PREFILL_CHUNK
    if chunk % page == 0:
        why = (f"{chunk}-token chunks (a GGUF model's prompt tokens cost about twice a bf16 "
               f"model's, its weight pass a third)" if gguf else f"{chunk}-token chunks")
        out.append(SettingAdjustment(
            "chunked_prefill_size", chunk,
            f"a CPU GEMM is near its peak from a few hundred rows; {why} let first tokens out "
            "request by request"))
    if getattr(args, "speculative_algorithm", None) is None and (getattr(args, "pp_size", 1) or 1) == 1:
        out.append(SettingAdjustment(
            "enable_mixed_chunk", True,
            "running requests keep decoding in the steps that prefill new ones"))
    return out


def create_platform(result: ProbeResult) -> Platform:
    assert result.device is not None
    return CpuPlatform(result.device)
