"""Batch invariance of the block GEMM (``kernels.fgemm``, float32, int16 and int8 activations) and of
the decode attention kernel used for every query row: a row's result is the same bits whatever
the other rows of the call, their number, the thread count, and (attention) whether the row came
as a prefill, an extend after cached keys or a decode step."""

from __future__ import annotations

import gguf
import pytest
import torch
from infer_cpu import kernels
from infer_cpu.quant.packing import Q, gguf_qweight

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason=f"native kernels unavailable: {kernels.status().detail}")


def _qweight(n: int, k: int, qtype: Q, seed: int):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return gguf_qweight(torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype)), qtype, n)


@pytest.mark.parametrize("packed", [False, True], ids=["repacked", "packed"])
@pytest.mark.parametrize("precision", ["float32", "int16", "int8"])
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_fgemm_rows_do_not_depend_on_the_batch(qtype, precision, packed, with_threads):
    """Every activation precision alike (``INFER_CPU_ACTIVATIONS``); packed: with tiles packed at
    load (``kernels.with_tiles``), which a call of 3 rows or more reads (two tiles side by side
    from 16 rows, one from fewer) and a call of 1-2 rows does not, so a row's bits must not
    depend on which one ran."""
    qw = _qweight(75, 576, qtype, seed=3).with_activations(precision)
    if packed:
        qw = kernels.with_tiles(qw)
    bias = torch.randn(75)
    x = torch.randn(131, 576) * torch.rand(131, 1) * 3  # 131: past two 64-row blocks, odd tail
    alone = torch.cat([kernels.fgemm(x[i:i + 1], qw, bias) for i in range(x.shape[0])])
    for threads in (1, 2):
        for m in (2, 3, 4, 5, 31, 32, 64, 65, 128, 129, 131):
            got = with_threads(threads, lambda m=m: kernels.fgemm(x[:m], qw, bias))
            assert torch.equal(got, alone[:m]), (threads, m)
    # a row placed anywhere in a batch (other rows, other tile position) keeps its bits
    perm = torch.randperm(131, generator=torch.Generator().manual_seed(0))
    assert torch.equal(kernels.fgemm(x[perm], qw, bias), alone[perm])


def _meta(steps: list[tuple[int, int, list[int]]], page: int):
    """Metadata of one step: per sequence (prefix, extend, page list)."""
    from infer.core.ops.attention import AttentionMetadata

    width = max(len(p) for _, _, p in steps)
    slots = [pages[pos // page] * page + pos % page for pre, ext, pages in steps
             for pos in range(pre, pre + ext)]
    ext = [e for _, e, _ in steps]
    seq = [p + e for p, e, _ in steps]
    return AttentionMetadata(
        num_seqs=len(steps), num_tokens=sum(ext), page_size=page,
        query_start_loc=torch.tensor([0, *ext]).cumsum(0).to(torch.int32),
        seq_lens=torch.tensor(seq, dtype=torch.int32),
        prefix_lens=torch.tensor([p for p, _, _ in steps], dtype=torch.int32),
        block_tables=torch.tensor([p + [0] * (width - len(p)) for _, _, p in steps],
                                  dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), seq_lens_cpu=seq, extend_lens_cpu=ext,
        max_seq_len=max(seq), max_extend_len=max(ext))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_attention_rows_do_not_depend_on_the_split(kv_dtype):
    """One 40-token sequence's query rows as one prefill, as a prefill of 25 then an extend of 15
    (beside another sequence), and as a prefill of 30 then ten decode steps (beside another
    decode row): the same bits for every row, over each cache dtype a float32 model keeps."""
    from infer.core.ops.attention import AttentionConfig
    from infer_cpu.ops.attention import TorchNativeAttention

    h, hkv, d, page, n = 6, 2, 64, 4, 40
    cfg = AttentionConfig(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=d ** -0.5,
                          page_size=page, dtype=torch.float32, kv_dtype=kv_dtype,
                          device=torch.device("cpu"), num_layers=1)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(n, x, d, generator=g) for x in (h, hkv, hkv))
    other_q, other_k, other_v = (torch.randn(20, x, d, generator=g) for x in (h, hkv, hkv))
    mine, theirs = [3, 9, 1, 7, 12, 4, 10, 2, 11, 5], [6, 8, 13, 14, 15]

    def run(splits: list[tuple[int, int]]) -> torch.Tensor:
        attn = TorchNativeAttention(cfg)
        kc, vc = (torch.zeros(16, page, hkv, d, dtype=kv_dtype) for _ in range(2))
        outs, o_pos = [], 0
        for pre, ext in splits:  # the other sequence adds one token per step beside ours
            meta = _meta([(pre, ext, mine), (o_pos, 1, theirs)], page)
            attn.plan(meta)
            sl = slice(pre, pre + ext)
            out = attn.forward(torch.cat([q[sl], other_q[o_pos:o_pos + 1]]),
                               torch.cat([k[sl], other_k[o_pos:o_pos + 1]]),
                               torch.cat([v[sl], other_v[o_pos:o_pos + 1]]), kc, vc, 0)
            assert attn._native  # the native kernel ran (not the reference)
            outs.append(out[:ext])
            o_pos += 1
        return torch.cat(outs)

    whole = run([(0, n)])
    assert torch.equal(run([(0, 25), (25, 15)]), whole)
    assert torch.equal(run([(0, 30)] + [(p, 1) for p in range(30, 40)]), whole)
