"""``infer_cpu.hugepages``: the KV cache and the native stacks' weights are advised onto
transparent huge pages (``MADV_HUGEPAGE``: the ``hg`` flag of their mapping in
/proc/self/smaps), their values unchanged; ``INFER_CPU_HUGE_PAGES=0`` leaves them as torch
allocates them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from infer_cpu import hugepages

needs_thp = pytest.mark.skipif(hugepages.mode() not in ("madvise", "always"),
                               reason=f"transparent huge pages: {hugepages.mode()}")


def _mapping(t: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds t's first byte."""
    addr, fields, inside = t.data_ptr(), {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            if inside:
                break
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _advised(t: torch.Tensor) -> bool:
    """Whether t's mapping carries MADV_HUGEPAGE (VmFlags ``hg``)."""
    return "hg" in _mapping(t).get("VmFlags", "").split()


def _fallbacks() -> int:
    """Huge-page faults the kernel served with small pages (no 2 MB page free), so far."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_fallback "):
            return int(line.split()[1])
    return 0


@needs_thp
def test_zeros_are_advised_zeros():
    before = _fallbacks()
    t = hugepages.zeros((6000, 4, 3, 64), torch.bfloat16)  # 9 MB
    assert t.shape == (6000, 4, 3, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert not t.any()
    assert t.data_ptr() % hugepages.HUGE == 0 and _advised(t)
    if _fallbacks() == before:  # the kernel had 2 MB pages to give: the cache is on them
        assert int(_mapping(t)["AnonHugePages"].split()[0]) >= 4 * 2048


@needs_thp
def test_alloc_cuts_small_buffers_from_advised_slabs_and_rehome_copies():
    a, b = hugepages.alloc(1000), hugepages.alloc(300_000)
    assert a.data_ptr() % 64 == 0 and b.data_ptr() % 64 == 0
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()  # one slab
    assert _advised(a) and _advised(b)
    big = hugepages.alloc(hugepages.SLAB)  # its own buffer
    assert big.numel() == hugepages.SLAB and _advised(big)
    w = torch.randn(700, 96).bfloat16()
    moved = hugepages.rehome(w)
    assert torch.equal(moved, w) and moved.data_ptr() != w.data_ptr() and _advised(moved)


def _ours(t: torch.Tensor) -> bool:
    """Whether t lives in one of hugepages' own mappings (2 MB longer than the buffer asked for).
    (Whether torch's memory is advised depends on what else the process did: not asked here.)"""
    return t.untyped_storage().nbytes() >= t.numel() * t.element_size() + hugepages.HUGE


def test_off_means_torch_allocations(monkeypatch):
    monkeypatch.setenv("INFER_CPU_HUGE_PAGES", "0")
    assert not hugepages.enabled()
    raw, offset = hugepages.empty(6 << 20)
    assert offset == 0 and raw.numel() == 6 << 20
    t = hugepages.zeros((5_000_000,), torch.float32)
    assert not t.any() and not _ours(t)
    assert hugepages.alloc(100).numel() == 100 and not _ours(hugepages.alloc(6 << 20))
    if hugepages.mode() in ("madvise", "always"):
        assert "INFER_CPU_HUGE_PAGES=0" in hugepages.describe()


@needs_thp
def test_engine_caches_and_bf16_weights_are_advised(tiny_bf16, greedy):
    """A tiny bf16 model: every layer's cache and the packed weights the native stack reads are
    advised, and the greedy tokens are those of the same engine with huge pages off."""
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer_cpu.kernels import bf16 as kb

    if kb.load() is None:
        pytest.skip(f"bf16 kernels unavailable: {kb.detail()}")
    prompts = [list(range(5, 12)), list(range(40, 61))]
    outs = []
    for on in ("1", "0"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("INFER_CPU_HUGE_PAGES", on)
            # 131,072 tokens: each layer's keys 8 MB, past the size worth advising
            core = EngineCore(ServerArgs(model_path=str(tiny_bf16), dtype="bfloat16", page_size=4,
                                         max_total_tokens=131072))
            runner = core.runner
            assert runner.graph_runner.ok, runner.graph_runner.reason
            layer = runner.model.model.layers[0]
            held = [runner.kv_cache.k[0], runner.kv_cache.v[-1],
                    layer.mlp.gate_up_proj.bf16_packed.data, runner.model.lm_head.bf16_packed.data]
            if on == "1":
                assert all(_advised(t) for t in held)
            else:
                assert not any(_ours(t) for t in held)
            outs.append(greedy(core, prompts, 12))
    assert outs[0] == outs[1]
