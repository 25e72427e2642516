"""Tensor and expert parallelism on the Ascend platform with two real processes, the group formed
with the platform's backend "hccl" (gloo carries it under the emulation; HCCL on NPUs with
INFER_ASCEND_HARDWARE=1): every rank's logits (prefill, chunked prefill, decode rows) equal the
one-rank model's within float16 tolerance. The MoE model also runs with ep=2 (each rank holds
half the experts; the core's MoE layer hands the plugin's runner this rank's assignments and
all-reduces through the plugin's HCCL communicator). A msModelSlim checkpoint (mixed W8A8 static /
dynamic / W8A16 / FLOAT layers) runs at tp=2: per-part input scales of merged column-parallel
layers, the row-parallel quant_bias added once."""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
from pathlib import Path

import pytest
import torch

from .conftest import HARDWARE
from .hf_models import hf_tiny
from .paged_driver import PAGE, Pages
from .ranks import run_ranks

HERE = Path(__file__).resolve().parent
TOL = 1e-2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    from .modelslim_ckpt import calibrate, write_modelslim

    out = []
    for arch, tp, ep, quant in (("llama", 2, 1, None), ("mixtral", 2, 2, None),
                                ("qwen2", 2, 1, "modelslim")):
        path = tmp_path_factory.mktemp(arch)
        gen = torch.Generator().manual_seed(3)
        if quant is None:
            hf_tiny.save_tiny(arch, path)
        else:  # a msModelSlim checkpoint: per-part input scales, row-parallel quant_bias
            hf = hf_tiny.save_tiny(arch, path / "float", initializer_range=0.05)
            calib = calibrate(hf, torch.randint(0, 90, (2, 64), generator=gen))
            path = write_modelslim(hf, path / "float", path / "ms", torch.float16, calib)
        a = torch.randint(0, 90, (150,), generator=gen).tolist()
        b = torch.randint(0, 90, (9,), generator=gen).tolist()
        work = [[("a", a[:100]), ("b", b)], [("a", a[100:149])], [("a", a[149:]), ("b", [5])]]
        out.append({"name": f"{arch}_tp{tp}_ep{ep}_{quant}", "path": str(path), "tp": tp,
                    "ep": ep, "quantization": quant, "work": work,
                    # per-token int8 scales of a row-parallel W8A8_DYNAMIC layer come from each
                    # rank's half of the input, not the one-rank model's whole row (measured
                    # 0.015 at the first step)
                    "tol": TOL if quant is None else 3e-2})
    return out


@pytest.mark.slow
def test_two_ranks_match_one(cases, ascend, device, tmp_path):
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import ascend_ep_worker
    from infer.core.model.loader import load_model
    from infer.core.plugins import get_plugin_host

    ctx = mp.get_context("spawn")
    port = _port()
    done = ctx.Barrier(2)  # the ranks' teardown handshake (ascend_ep_worker.run)
    procs = [ctx.Process(target=ascend_ep_worker.run,
                         args=(r, 2, port, str(tmp_path), not HARDWARE, cases, done))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for c in cases:
        one = load_model(c["path"], platform=ascend, host=get_plugin_host(), dtype="float16",
                         quantization=c["quantization"], page_size=PAGE,
                         skip_tokenizer_init=True, progress=False)
        pages = Pages(one, device)
        for i, batch in enumerate(c["work"]):
            ref = torch.cat(pages.step(batch)).float()
            for r, res in enumerate(ranks):
                err = ((res[c["name"]][i].float() - ref).abs().max() / ref.abs().max()).item()
                assert err < c["tol"], (c["name"], i, r, err)
    for r in ranks:  # the communicator's all_gather along the last dim, rank-major
        assert r["_all_gather"].tolist() == [[0.0, 1.0]] * 2


@pytest.fixture(scope="module")
def mc2_case(tmp_path_factory):
    """A Qwen3-MoE whose shapes meet MC2's A3 constraints: hidden size 7168, 16 experts over 8
    ranks, top-2; small otherwise (1 head of 16 per rank, 2 layers, vocab 128)."""
    path = tmp_path_factory.mktemp("qwen3_moe_h7168")
    hf_tiny.save_tiny("qwen3_moe", path, hidden_size=7168, num_attention_heads=8,
                      num_key_value_heads=8, head_dim=16, intermediate_size=64,
                      moe_intermediate_size=32, num_experts=16, decoder_sparse_step=1,
                      vocab_size=128, initializer_range=0.02)
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(0, 128, (40,), generator=gen).tolist()
    b = torch.randint(0, 128, (7,), generator=gen).tolist()
    # prefill of 47 tokens (6 per rank, padded), then decode rows: 2 tokens over 8 ranks
    work = [[("a", a[:38]), ("b", b)], [("a", a[38:39]), ("b", [3])], [("a", a[39:])]]
    return {"path": str(path), "tp": 8, "ep": 8, "quantization": None, "work": work,
            "rank_tokens": True}


@pytest.mark.slow
@pytest.mark.skipif(HARDWARE, reason="switches the emulated chip between A3 and A2 per case")
def test_mc2_on_a3_matches_all_gather_and_one_rank(mc2_case, ascend, device, tmp_path):
    """ep=8 over eight ranks: on A3 the Ascend runner takes the dispatch through MC2 (counted
    per rank), on A2 the same model goes through the core's all-gather path (no MC2 call); the
    two agree with each other and with the one-rank model."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import ascend_ep_worker
    from infer.core.model.loader import load_model
    from infer.core.plugins import get_plugin_host

    world = 8
    cases = [dict(mc2_case, name="mc2", generation="A3"),
             dict(mc2_case, name="all_gather", generation="A2")]
    run_ranks(ascend_ep_worker.run, world,
              lambda r, port, done: (r, world, port, str(tmp_path), True, cases, done))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    layers, steps = 2, len(mc2_case["work"])
    for res in ranks:
        # every MoE layer of every step, and one forward_rank_tokens
        assert res["mc2_mc2_calls"] == layers * steps + 1
        assert res["all_gather_mc2_calls"] == 0
    one = load_model(mc2_case["path"], platform=ascend, host=get_plugin_host(), dtype="float16",
                     page_size=PAGE, skip_tokenizer_init=True, progress=False)
    pages = Pages(one, device)
    for i, batch in enumerate(mc2_case["work"]):
        ref = torch.cat(pages.step(batch)).float()
        for r, res in enumerate(ranks):
            mc2, gathered = res["mc2"][i].float(), res["all_gather"][i].float()
            for got, label in ((mc2, "mc2 vs one rank"), (gathered, "all-gather vs one rank"),
                               (mc2, "mc2 vs all-gather")):
                want = gathered if label == "mc2 vs all-gather" else ref
                err = ((got - want).abs().max() / want.abs().max()).item()
                assert err < TOL, (label, i, r, err)
    # ranks holding different tokens (forward_rank_tokens): MC2 on A3 (no reduce-scatter by the
    # layer), all-gather + reduce-scatter on A2, against the one-rank layer on all the tokens
    from infer.core.model.layers.moe import SparseMoE

    moe = next(m for m in one.model.modules() if isinstance(m, SparseMoE))
    xs = ascend_ep_worker.rank_tokens(world, moe.w13.shape[2])
    with torch.inference_mode():
        ref = moe(torch.cat(xs).to(moe.w13.dtype).to(device)).float().cpu()
    start = 0
    for r, (res, x) in enumerate(zip(ranks, xs, strict=True)):
        want = ref[start:start + x.shape[0]]
        start += x.shape[0]
        for case in ("mc2", "all_gather"):
            got = res[case + "_rank_tokens"].float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            assert err < TOL, (case, "forward_rank_tokens", r, err)
