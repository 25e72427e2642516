"""Extend (prefill) CUDA graphs without a GPU: bucket settings, which batches the graphs cover,
the in-place copy into a bucket's static batch, and the Triton extend kernel run the way a graph
runs it (max_extend_len fixed to the bucket, padding rows after the real ones) against the float64
reference under TRITON_INTERPRET=1."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from infer.core.config.flags import FLAG_SPECS, ConfigError
from infer.core.config.views import GraphConfig
from infer.core.ops.attention import AttentionMetadata, KVCache
from infer.core.ops.forward_batch import ForwardBatch
from infer_cuda.graph_runner import (
    DEFAULT_PIECEWISE_MAX_TOKENS,
    CudaGraphRunner,
    extend_bucket,
    extend_token_buckets,
    load_extend_inputs,
    static_extend_batch,
)
from kernel_utils import (
    CAN_RUN_KERNELS,
    KERNEL_DEVICE,
    SKIP_REASON,
    bf16_tol,
    make_paged_batch,
    reference_attention,
    rel_err,
)


def _args(**kw: object) -> GraphConfig:
    """The GraphConfig view of these server flags (piecewise graphs on unless said otherwise)."""
    names = dict(enable_piecewise_cuda_graph="enable_piecewise",
                 piecewise_cuda_graph_max_tokens="piecewise_max_tokens",
                 piecewise_cuda_graph_tokens="piecewise_tokens",
                 chunked_prefill_size="chunked_prefill_size")
    base = dict(enable_piecewise=True, piecewise_max_tokens=None)
    base.update({names[k]: v for k, v in kw.items()})
    return GraphConfig(**base)


def _batch(prefix: list[int], extend: list[int], logit_rows: list[int] | None = None,
           width: int = 4) -> ForwardBatch:
    """A CPU ForwardBatch shaped as the model runner builds one (positions prefix.., slots at
    101.., block table rows of page ids 1..)."""
    t = sum(extend)
    qsl = [0]
    for e in extend:
        qsl.append(qsl[-1] + e)
    seq = [p + e for p, e in zip(prefix, extend, strict=True)]
    pos = [p + i for p, e in zip(prefix, extend, strict=True) for i in range(e)]
    i32 = torch.int32
    meta = AttentionMetadata(
        num_seqs=len(extend), num_tokens=t, page_size=1,
        query_start_loc=torch.tensor(qsl, dtype=i32), seq_lens=torch.tensor(seq, dtype=i32),
        prefix_lens=torch.tensor(prefix, dtype=i32),
        block_tables=torch.arange(1, 1 + len(extend) * width, dtype=i32).view(len(extend), width),
        slot_mapping=torch.arange(101, 101 + t), seq_lens_cpu=seq, extend_lens_cpu=list(extend),
        max_seq_len=max(seq), max_extend_len=max(extend))
    rows = logit_rows if logit_rows is not None else [t - 1]
    return ForwardBatch(input_ids=torch.arange(1000, 1000 + t), positions=torch.tensor(pos),
                        attn=meta, logits_indices=torch.tensor(rows), kv_cache=None)


# -- settings ------------------------------------------------------------------------------------
def test_buckets_off_unless_flag():
    assert extend_token_buckets(_args(enable_piecewise_cuda_graph=False), 8192) == []


def test_default_max_tokens_is_sglangs():
    spec = next(s for s in FLAG_SPECS.values() if s.dest == "piecewise_cuda_graph_max_tokens")
    assert spec.default == DEFAULT_PIECEWISE_MAX_TOKENS == 4096


def test_default_buckets():
    b = extend_token_buckets(_args(), 8192)
    assert b[:6] == [16, 32, 48, 64, 96, 128] and b[-1] == 4096
    assert b == sorted(set(b))
    # padding bounded: each bucket at most 1.5x the one below it (2x for the first step)
    assert all(hi <= 1.5 * lo for lo, hi in zip(b[1:], b[2:], strict=False))


def test_default_buckets_clamped_by_chunk_context_and_max():
    assert extend_token_buckets(_args(chunked_prefill_size=100), 8192)[-2:] == [96, 100]
    assert extend_token_buckets(_args(chunked_prefill_size=16), 8192) == [16]
    assert extend_token_buckets(_args(chunked_prefill_size=-1), 8192)[-1] == 4096  # no chunking
    assert extend_token_buckets(_args(), 300)[-1] == 300
    assert extend_token_buckets(_args(piecewise_cuda_graph_max_tokens=40), 8192) == [16, 32, 40]
    assert extend_token_buckets(_args(piecewise_cuda_graph_max_tokens=2), 8192) == [2]


def test_explicit_buckets():
    assert extend_token_buckets(_args(piecewise_cuda_graph_tokens=[64, 16, 16, 300]), 8192) == \
        [16, 64, 300]
    # an explicit list is not clamped by the chunk size: a 100-token chunk pads to 128
    assert extend_token_buckets(_args(piecewise_cuda_graph_tokens=[128], chunked_prefill_size=100),
                                8192) == [128]


@pytest.mark.parametrize("kw", [
    dict(piecewise_cuda_graph_tokens=[1, 16]),  # 1 token is a decode row
    dict(piecewise_cuda_graph_tokens=[16, 5000]),  # above the default max 4096
    dict(piecewise_cuda_graph_tokens=[64], piecewise_cuda_graph_max_tokens=32),
    dict(piecewise_cuda_graph_tokens=["16"]),
    dict(piecewise_cuda_graph_tokens=[]),
    dict(piecewise_cuda_graph_tokens=16),
    dict(piecewise_cuda_graph_max_tokens=1),
])
def test_bad_settings_are_errors(kw):
    with pytest.raises(ConfigError, match="piecewise-cuda-graph"):
        extend_token_buckets(_args(**kw), 8192)


# -- which batches the extend graphs cover -------------------------------------------------------
BUCKETS = [16, 32, 64]


@pytest.mark.parametrize("prefix,extend,rows,want", [
    ([0], [5], None, 16),  # fresh prompt, padded
    ([0], [16], None, 16),  # exactly a bucket
    ([0], [17], None, 32),
    ([40], [9], None, 16),  # chunk / prompt over a cached prefix
    ([0], [64], None, 64),
    ([0], [65], None, None),  # more tokens than the largest bucket
    ([0, 0], [5, 7], [4, 11], None),  # two sequences
    ([3, 9], [1, 1], [0, 1], None),  # decode batch: the decode graphs' business
    ([9], [1], None, None),  # one decode row
    ([0], [8], list(range(8)), None),  # prompt logprobs: several logits rows
    ([0], [8], [3], 16),  # one row that is not the last: still copied in place
])
def test_extend_bucket(prefix, extend, rows, want):
    assert extend_bucket(_batch(prefix, extend, rows), BUCKETS, max_pages=8, padding=True) == want


def test_extend_bucket_without_padding_and_wide_tables():
    assert extend_bucket(_batch([0], [5]), BUCKETS, 8, padding=False) is None
    assert extend_bucket(_batch([0], [32]), BUCKETS, 8, padding=False) == 32
    assert extend_bucket(_batch([0], [5], width=9), BUCKETS, 8, padding=True) is None


def _runner(backend: object, **kw: object) -> CudaGraphRunner:
    mr = SimpleNamespace(attn_backend=backend, context_length=2048, max_pages_per_seq=8)
    return CudaGraphRunner(mr, _args(**kw))


def test_runner_needs_an_extend_capturable_backend():
    flashinfer_like = SimpleNamespace(name="flashinfer", supports_graph_capture=False)
    with pytest.raises(ConfigError, match="--attention-backend triton"):
        _runner(flashinfer_like)
    # without the flag the same backend is fine (decode graphs are simply off, as before)
    assert _runner(flashinfer_like, enable_piecewise_cuda_graph=False).ext_buckets == []


def test_runner_covers_only_captured_buckets():
    from infer_cuda.ops.attention_triton import TritonAttention

    r = _runner(TritonAttention, piecewise_cuda_graph_tokens=[16, 32])
    assert r.ext_buckets == [16, 32]
    assert not r.can_run(_batch([0], [5]))  # nothing captured yet (capture() needs CUDA)
    r._ext_captured = [16, 32]
    assert r.can_run(_batch([0], [5])) and r.can_run(_batch([7], [32]))
    assert not r.can_run(_batch([0], [33])) and not r.can_run(_batch([0, 0], [3, 3], [2, 5]))


# -- the in-place copy into a bucket's static batch ----------------------------------------------
def test_load_extend_inputs_pads_to_scratch_page():
    kv = KVCache(k=[], v=[])
    st = static_extend_batch(16, max_pages=8, page_size=1, kv_cache=kv, device=torch.device("cpu"))
    assert st.attn.max_extend_len == 16 and st.attn.num_tokens == 16 and not st.attn.is_decode_only
    # stale contents of an earlier, longer replay
    for t in (st.input_ids, st.positions, st.attn.slot_mapping, st.attn.block_tables):
        t.fill_(7)
    src = _batch([3], [5], width=4)
    load_extend_inputs(st, src)
    m = st.attn
    assert st.input_ids.tolist() == list(range(1000, 1005)) + [0] * 11
    assert st.positions.tolist() == [3, 4, 5, 6, 7] + [0] * 11
    assert m.slot_mapping.tolist() == list(range(101, 106)) + [0] * 11  # padding -> slot 0
    assert m.query_start_loc.tolist() == [0, 5]  # the real extent, not the bucket's
    assert m.seq_lens.tolist() == [8] and m.prefix_lens.tolist() == [3]
    assert m.block_tables.tolist() == [[1, 2, 3, 4, 0, 0, 0, 0]]
    assert st.logits_indices.tolist() == [4]
    assert (m.num_tokens, m.max_extend_len) == (16, 16)  # launch shapes stay the bucket's
    assert m.prefix_lens_cpu == [3] and m.extend_lens_cpu == [5]


# -- the extend kernel as a graph launches it ----------------------------------------------------
def _with_scratch_page(pb):  # noqa: ANN001, ANN202
    """The batch moved one page up, page 0 a NaN scratch page (as the model runner's page 0)."""
    page = pb.k_cache.shape[1]
    nan = torch.full_like(pb.k_cache[:1], float("nan"))
    return replace(pb, k_cache=torch.cat([nan, pb.k_cache]), v_cache=torch.cat([nan, pb.v_cache]),
                   block_tables=pb.block_tables + 1, slot_mapping=pb.slot_mapping + page)


@pytest.mark.skipif(not CAN_RUN_KERNELS, reason=SKIP_REASON)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix,ext,bucket,page", [
    (0, 5, 16, 1),
    (13, 17, 32, 4),
    (40, 33, 64, 16),
    (7, 64, 64, 8),  # no padding
    (21, 50, 128, 4),  # a second query block made only of padding rows
])
def test_extend_kernel_padded_to_bucket(prefix, ext, bucket, page, dtype):
    from infer_cuda.kernels.extend_attention import extend_attention
    from infer_cuda.kernels.kv_store import store_kv

    h, hkv, d = 4, 2, 64
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    pb = _with_scratch_page(make_paged_batch([prefix], [ext], h, hkv, d, page, dtype, KERNEL_DEVICE,
                                             gen))
    pad = bucket - ext

    def padded(x: torch.Tensor) -> torch.Tensor:  # garbage rows after the real ones
        junk = torch.randn((pad, *x.shape[1:]), generator=gen).to(dtype).to(KERNEL_DEVICE) * 100
        return torch.cat([x, junk])

    q, k, v = padded(pb.q), padded(pb.k_new), padded(pb.v_new)
    slots = torch.cat([pb.slot_mapping, torch.zeros(pad, dtype=torch.int64, device=KERNEL_DEVICE)])
    wide = torch.zeros(1, 40, dtype=torch.int32, device=KERNEL_DEVICE)  # static [1, max_pages]
    wide[:, :pb.block_tables.shape[1]] = pb.block_tables
    store_kv(k, v, pb.k_cache, pb.v_cache, slots)
    out = torch.full_like(q, float("nan"))
    extend_attention(q, pb.k_cache, pb.v_cache, pb.query_start_loc,
                     torch.tensor([prefix], dtype=torch.int32, device=KERNEL_DEVICE), wide,
                     bucket, out, scale=d ** -0.5)
    ref = reference_attention(pb, d ** -0.5)
    assert rel_err(out[:ext], ref) < (bf16_tol() if dtype == torch.bfloat16 else 1e-4)
    assert torch.equal(out[ext:].cpu(), torch.zeros_like(out[ext:].cpu()))  # padding rows: zeros


@pytest.mark.skipif(not CAN_RUN_KERNELS, reason=SKIP_REASON)
def test_extend_kernel_leaves_rows_of_other_sequences_alone():
    """Several sequences (an eager batch): only rows after the LAST sequence count as padding."""
    from infer_cuda.kernels.extend_attention import extend_attention
    from infer_cuda.kernels.kv_store import store_kv

    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    prefix, ext = [5, 0, 9], [3, 20, 6]
    pb = make_paged_batch(prefix, ext, 4, 2, 32, 4, torch.float32, KERNEL_DEVICE, gen)
    store_kv(pb.k_new, pb.v_new, pb.k_cache, pb.v_cache, pb.slot_mapping)
    out = torch.full_like(pb.q, float("nan"))
    extend_attention(pb.q, pb.k_cache, pb.v_cache, pb.query_start_loc,
                     torch.tensor(prefix, dtype=torch.int32, device=KERNEL_DEVICE),
                     pb.block_tables, 32, out, scale=32 ** -0.5, block_m=16, block_n=16)
    assert rel_err(out, reference_attention(pb, 32 ** -0.5)) < 1e-4
