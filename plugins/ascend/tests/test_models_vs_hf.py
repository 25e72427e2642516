"""Every architecture's tiny random model on the Ascend platform (float16, page size 128) against
transformers (float32) on the same weights: logits of chunked prefill, of decode rows mixed into
the same batches, and of an extend over a prefix cached by another sequence (its pages shared,
as the radix cache shares them). Teacher-forced: both sides see the same tokens."""

from __future__ import annotations

import pytest
import torch
from infer.core.model.loader import load_model

from .hf_models import hf_tiny
from .paged_driver import PAGE, Pages

ARCHS = ["llama", "llama_tied", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"]
TOL = 2e-2  # float16 activations against float32 transformers, relative to the largest logit


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = hf_tiny.save_tiny(request.param, path)
    gen = torch.Generator().manual_seed(1)
    v = hf.config.vocab_size
    shared = torch.randint(0, v, (PAGE,), generator=gen).tolist()
    seq_a = shared + torch.randint(0, v, (30,), generator=gen).tolist()  # chunked prefill + decode
    seq_b = shared + torch.randint(0, v, (20,), generator=gen).tolist()  # extends A's prefix
    seq_c = torch.randint(0, v, (9,), generator=gen).tolist()  # short, decodes alongside
    with torch.no_grad():
        ref = {k: hf(torch.tensor([s])).logits[0] for k, s in
               (("a", seq_a), ("b", seq_b), ("c", seq_c))}
    return request.param, path, {"a": seq_a, "b": seq_b, "c": seq_c}, ref


def test_logits_match_transformers(tiny, ascend, device, monkeypatch):
    arch, path, seqs, ref = tiny
    import torch_npu
    from infer.core.model.layers.moe import SparseMoE
    from infer.core.plugins import get_plugin_host

    routed = []  # rows routed by the gating op: the MoE layers must route through the runner's
    gating = torch_npu.npu_moe_gating_top_k_softmax  # select_experts, i.e. this op

    def counting_gating(x, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        routed.append(x.shape[0])
        return gating(x, *args, **kwargs)

    monkeypatch.setattr(torch_npu, "npu_moe_gating_top_k_softmax", counting_gating)

    loaded = load_model(str(path), platform=ascend, host=get_plugin_host(), dtype="float16",
                        page_size=PAGE, skip_tokenizer_init=True, progress=False)
    ctx = loaded.ctx
    assert ctx.attn_backend.name == "ascend"
    assert type(ctx.linear_method).__module__ == "infer_ascend.ops.linear"
    assert all(getattr(getattr(ctx.ops, op), "__wrapped__", None) is not None
               for op in ("rms_norm", "rotary", "silu_and_mul"))  # the plugin's layer ops
    pages = Pages(loaded, device)
    a, b, c = seqs["a"], seqs["b"], seqs["c"]
    got = {"a": [], "b": [], "c": []}
    # chunked prefill of A (3 chunks over its own cached prefix) while C prefills then decodes
    for i, (chunk_a, toks_c) in enumerate([(a[:64], c[:5]), (a[64:128], c[5:9]),
                                           (a[128:150], c[9:])]):
        work = [("a", chunk_a)] + ([("c", toks_c)] if toks_c else [])
        out = pages.step(work)
        got["a"].append(out[0])
        if toks_c:
            got["c"].append(out[1])
        assert i < 3
    for j in range(150, len(a)):  # decode rows of A (teacher-forced), with B's extend at j=150
        work = [("a", [a[j]])]
        if j == 150:
            pages.share_prefix("a", "b", 1)  # B reuses A's first page: 128 cached tokens
            work.append(("b", b[PAGE:]))
        out = pages.step(work)
        got["a"].append(out[0])
        if j == 150:
            got["b"].append(out[1])
    moe_layers = sum(isinstance(m, SparseMoE) for m in loaded.model.modules())
    assert (moe_layers > 0) == (arch in ("mixtral", "qwen3_moe")), arch
    # every token of every step through every MoE layer was routed by npu_moe_gating_top_k_softmax
    assert sum(routed) == moe_layers * (len(a) + len(b) - PAGE + len(c)), arch
    logits_a = torch.cat(got["a"])
    assert logits_a.shape[0] == len(a)
    assert rel_err(logits_a, ref["a"]) < TOL, arch
    assert rel_err(torch.cat(got["b"]), ref["b"][PAGE:]) < TOL, arch
    assert rel_err(torch.cat(got["c"]), ref["c"]) < TOL, arch
    assert torch.equal(logits_a[-8:].argmax(-1), ref["a"][-8:].argmax(-1)) or \
        rel_err(logits_a[-8:], ref["a"][-8:]) < TOL / 4
