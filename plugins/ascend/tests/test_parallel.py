"""Tensor and expert parallelism on the Ascend platform with two real processes, the group formed
with the platform's backend "hccl" (gloo carries it under the emulation; HCCL on NPUs with
INFER_ASCEND_HARDWARE=1): every rank's logits (prefill, chunked prefill, decode rows) equal the
one-rank model's within float16 tolerance. The MoE model also runs with ep=2 (each rank holds
half the experts; the core's MoE layer hands the plugin's runner this rank's assignments and
all-reduces through the plugin's HCCL communicator)."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import socket
import sys
from pathlib import Path

import pytest
import torch

from .conftest import HARDWARE
from .paged_driver import PAGE, Pages

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
_spec = importlib.util.spec_from_file_location("hf_tiny", ROOT / "tests" / "model" / "hf_tiny.py")
hf_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_tiny)
TOL = 1e-2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = []
    for arch, tp, ep in (("llama", 2, 1), ("mixtral", 2, 2)):
        path = tmp_path_factory.mktemp(arch)
        hf_tiny.save_tiny(arch, path)
        gen = torch.Generator().manual_seed(3)
        a = torch.randint(0, 90, (150,), generator=gen).tolist()
        b = torch.randint(0, 90, (9,), generator=gen).tolist()
        work = [[("a", a[:100]), ("b", b)], [("a", a[100:149])], [("a", a[149:]), ("b", [5])]]
        out.append({"name": f"{arch}_tp{tp}_ep{ep}", "path": str(path), "tp": tp, "ep": ep,
                    "work": work})
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
    procs = [ctx.Process(target=ascend_ep_worker.run,
                         args=(r, 2, port, str(tmp_path), not HARDWARE, cases)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for c in cases:
        one = load_model(c["path"], platform=ascend, host=get_plugin_host(), dtype="float16",
                         page_size=PAGE, skip_tokenizer_init=True, progress=False)
        pages = Pages(one, device)
        for i, batch in enumerate(c["work"]):
            ref = torch.cat(pages.step(batch)).float()
            for r, res in enumerate(ranks):
                err = ((res[c["name"]][i].float() - ref).abs().max() / ref.abs().max()).item()
                assert err < TOL, (c["name"], i, r, err)
    for r in ranks:  # the communicator's all_gather along the last dim, rank-major
        assert r["_all_gather"].tolist() == [[0.0, 1.0]] * 2
