"""CUDA probe: devices, compute capability and memory read through NVML, without a CUDA context.

Order: the torch build (a ROCm or CPU-only torch is not ours), then NVML (``pynvml`` from
nvidia-ml-py, or libnvidia-ml through ctypes), then ``nvidia-smi``. None of these creates a CUDA
context, so probing stays cheap and leaves the device untouched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass

from infer.core.platform import DeviceInfo, ProbeResult

PLATFORM = "cuda"


@dataclass(frozen=True)
class GpuRecord:
    name: str
    memory_bytes: int
    major: int
    minor: int


def sm_generation(major: int, minor: int) -> str | None:
    """Support-matrix column for a compute capability; None below sm80 (not supported)."""
    if major == 8:
        return "sm89" if minor == 9 else "sm80"  # 8.0/8.6/8.7 share Ampere's feature set
    if major == 9:
        return "sm90"
    if major == 10 or major == 11:
        return "sm100"
    if major == 12:
        return "sm120"
    return None


def _torch_build_reason() -> str | None:
    """Why this torch cannot drive an NVIDIA GPU, or None if it can. Imports torch (no context)."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    if getattr(torch.version, "hip", None):
        return f"torch {torch.__version__} is a ROCm build (see infer-plugin-rocm)"
    if not getattr(torch.version, "cuda", None):
        return f"torch {torch.__version__} is built without CUDA"
    return None


def _nvml_records() -> list[GpuRecord] | None:
    """All GPUs through NVML, or None when NVML cannot be loaded."""
    try:
        import pynvml
    except ImportError:
        return _nvml_ctypes_records()
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            out.append(GpuRecord(name, mem, int(major), int(minor)))
        return out
    finally:
        pynvml.nvmlShutdown()


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _nvml_ctypes_records() -> list[GpuRecord] | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        out = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                continue
            buf = ctypes.create_string_buffer(96)
            lib.nvmlDeviceGetName(h, buf, 96)
            mem = _NvmlMemory()
            lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem))
            major, minor = ctypes.c_int(), ctypes.c_int()
            lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major), ctypes.byref(minor))
            out.append(GpuRecord(buf.value.decode(), int(mem.total), major.value, minor.value))
        return out
    finally:
        lib.nvmlShutdown()


def _smi_records() -> list[GpuRecord] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run(
            [exe, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    out = []
    for line in text.strip().splitlines():
        name, mem_mib, cap = (p.strip() for p in line.split(","))
        major, minor = (int(x) for x in cap.split("."))
        out.append(GpuRecord(name, int(float(mem_mib)) * 2**20, major, minor))
    return out


def _visible(records: list[GpuRecord]) -> list[GpuRecord]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return records if env is None else []
    idx = [int(x) for x in env.split(",") if x.strip().isdigit()]
    return [records[i] for i in idx if i < len(records)]


def probe() -> ProbeResult:
    reason = _torch_build_reason()
    if reason is not None:
        return ProbeResult.not_found(PLATFORM, reason)
    records = _nvml_records()
    if records is None:
        records = _smi_records()
    if records is None:
        why = ("no NVIDIA driver: /proc/driver/nvidia is absent" if not os.path.exists(
            "/proc/driver/nvidia") else "NVIDIA driver present but NVML could not be loaded")
        return ProbeResult.not_found(PLATFORM, f"{why} (libnvidia-ml / nvidia-smi not usable)")
    records = _visible(records)
    if not records:
        return ProbeResult.not_found(PLATFORM, "the NVIDIA driver reports no visible GPU "
                                               "(check CUDA_VISIBLE_DEVICES)")
    first = records[0]
    gen = sm_generation(first.major, first.minor)
    if gen is None:
        return ProbeResult.not_found(
            PLATFORM, f"{first.name} has compute capability {first.major}.{first.minor}; "
                      "infer's CUDA plugin needs sm80 or newer")
    info = DeviceInfo(kind=PLATFORM, generation=gen, name=first.name,
                      memory_bytes=first.memory_bytes, count=len(records),
                      details={"compute_capability": f"{first.major}.{first.minor}"})
    return ProbeResult(platform=PLATFORM, found=True, device=info)
