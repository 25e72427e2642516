"""The CUDA plugin's backends through the core interfaces, against the core's plain-torch
references (TorchNativeAttention, TorchMoERunner), on fresh random inputs.

Triton backends run compiled on a GPU or under TRITON_INTERPRET=1 on the CPU; FlashInfer only on
a GPU with flashinfer-python installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from infer.core.ops.attention import AttentionConfig, AttentionMetadata
from kernel_utils import CAN_RUN_KERNELS, HAS_GPU, INTERPRET, KERNEL_DEVICE, SKIP_REASON, bf16_tol, rel_err

pytestmark = pytest.mark.skipif(not CAN_RUN_KERNELS, reason=SKIP_REASON)


def _meta(prefix, ext, page, block_tables, slots, device) -> AttentionMetadata:
    seq = [p + e for p, e in zip(prefix, ext, strict=True)]
    qsl = torch.tensor([0] + ext).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        num_seqs=len(ext), num_tokens=sum(ext), page_size=page,
        query_start_loc=qsl.to(device), seq_lens=torch.tensor(seq, dtype=torch.int32, device=device),
        prefix_lens=torch.tensor(prefix, dtype=torch.int32, device=device),
        block_tables=block_tables, slot_mapping=slots, seq_lens_cpu=seq, extend_lens_cpu=list(ext),
        max_seq_len=max(seq), max_extend_len=max(ext))


def _backends():
    names = ["triton"]
    if HAS_GPU and not INTERPRET and importlib.util.find_spec("flashinfer") is not None:
        names.append("flashinfer")
    return names


def _make(name, cfg):
    if name == "triton":
        from infer_cuda.ops.attention_triton import TritonAttention

        return TritonAttention(cfg)
    from infer_cuda.ops.attention_flashinfer import FlashInferAttention

    return FlashInferAttention(cfg)


@pytest.mark.parametrize("rope", [False, True], ids=["rotated", "fused-rotary"])
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [
    ([0, 12, 5], [9, 1, 4], 4),  # prefill, decode and extend rows mixed
    ([30, 7, 64, 1], [1, 1, 1, 1], 16),  # decode-only
    ([0], [40], 1),
])
def test_backend_matches_torch_native(backend, dtype, batch, rope):
    """``rope``: q/k go in unrotated as views of one QKV projection, with the rotary table, to a
    backend that fuses rotary; the reference gets them rotated by the plain-torch rotary."""
    from infer.core.model.layers.rotary import rope_table
    from infer.core.ops.attention import RotaryArgs
    from infer.core.ops.layer_ops import rotary_ref
    from infer.core.ops.reference.attention import TorchNativeAttention

    if backend == "flashinfer" and dtype == torch.float32:
        pytest.skip("FlashInfer runs fp16/bf16 only")
    prefix, ext, page = batch
    h, hkv, d, layers = 8, 2, 64, 2
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    seq = [p + e for p, e in zip(prefix, ext, strict=True)]
    pages = [-(-s // page) for s in seq]
    num_pages = sum(pages) + 2
    perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()  # page 0 stays scratch
    tables = torch.zeros(len(seq), max(pages), dtype=torch.int32)
    slots, used = [], 0
    for b, (p, e) in enumerate(zip(prefix, ext, strict=True)):
        mine = perm[used:used + pages[b]]
        used += pages[b]
        tables[b, :len(mine)] = torch.tensor(mine)
        slots += [mine[i // page] * page + i % page for i in range(p, p + e)]
    dev = KERNEL_DEVICE
    meta = _meta(prefix, ext, page, tables.to(dev), torch.tensor(slots, device=dev), dev)
    cfg = AttentionConfig(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=d ** -0.5, page_size=page,
                          dtype=dtype, kv_dtype=dtype, device=torch.device(dev), num_layers=layers)
    shape = (num_pages, page, hkv, d)
    caches = [torch.randn(shape, generator=gen).to(dtype).to(dev) for _ in range(2 * layers)]
    ref_caches = [c.clone() for c in caches]
    ours, ref = _make(backend, cfg), TorchNativeAttention(cfg)
    if rope and not ours.fuses_rotary:
        pytest.skip(f"{backend} does not fuse rotary")
    ours.plan(meta)
    ref.plan(meta)
    T = sum(ext)
    positions = torch.tensor([i for p, e in zip(prefix, ext, strict=True) for i in range(p, p + e)],
                             device=dev)
    cos_sin = rope_table(d, 128, {"rope_theta": 10000.0}).to(dev)
    tol = bf16_tol() if dtype == torch.bfloat16 else 1e-4
    for layer in range(layers):
        qkv = torch.randn(T, (h + 2 * hkv) * d, generator=gen).to(dtype).to(dev)
        q, k, v = (x.view(T, -1, d) for x in qkv.split([h * d, hkv * d, hkv * d], dim=-1))
        if rope:
            out = ours.forward(q, k, v, caches[2 * layer], caches[2 * layer + 1], layer,
                               rotary=RotaryArgs(positions, cos_sin, d))
            q, k = rotary_ref(positions, q.float(), k.float(), cos_sin, d)
            q, k = q.to(dtype), k.to(dtype)
        else:
            out = ours.forward(q, k, v, caches[2 * layer], caches[2 * layer + 1], layer)
        expect = ref.forward(q, k, v, ref_caches[2 * layer], ref_caches[2 * layer + 1], layer)
        assert out.shape == q.shape and out.dtype == dtype
        assert rel_err(out, expect.float()) < tol
        if rope:  # rotated in float32 and rounded once by both: equal but for the last bit
            assert rel_err(caches[2 * layer], ref_caches[2 * layer]) < tol
            assert torch.equal(caches[2 * layer + 1], ref_caches[2 * layer + 1])
        else:
            assert torch.equal(caches[2 * layer], ref_caches[2 * layer])  # same k, same slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 33])
def test_triton_moe_runner_matches_torch_runner(dtype, num_tokens):
    from infer.core.ops.reference.moe import TorchMoERunner
    from infer_cuda.ops.moe import TritonMoERunner

    e, k, dim, inter = 8, 2, 64, 96
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    dev = KERNEL_DEVICE
    hidden = torch.randn(num_tokens, dim, generator=gen).to(dtype).to(dev)
    w13 = (torch.randn(e, 2 * inter, dim, generator=gen) / dim ** 0.5).to(dtype).to(dev)
    w2 = (torch.randn(e, dim, inter, generator=gen) / inter ** 0.5).to(dtype).to(dev)
    w, ids = torch.softmax(torch.randn(num_tokens, e, generator=gen), -1).topk(k, -1)
    w, ids = w.to(dev), ids.to(dev)
    out = TritonMoERunner().apply(hidden, w13, w2, w, ids)
    ref = TorchMoERunner().apply(hidden.double(), w13.double(), w2.double(), w.double(), ids)
    assert rel_err(out, ref) < (bf16_tol() if dtype == torch.bfloat16 else 1e-4)
