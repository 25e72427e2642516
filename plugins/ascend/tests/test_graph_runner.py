"""ACL-graph decode through the core's ModelRunner: graphs captured per batch size replay the
eager step's logits for batches with other lengths, page tables and sizes (padded), because the
runner copies the device inputs and hands the attention its host-side KV lengths through
``NPUGraph.update`` before each replay."""

from __future__ import annotations

import pytest
import torch
from infer.core.config.views import CacheConfig, EngineConfig, GraphConfig, LoadConfig
from infer.core.engine.model_runner import DecodeInputs, ModelRunner
from infer.core.model.loader import load_model

from .hf_models import hf_tiny

PAGE = 128


@pytest.fixture(scope="module")
def runner(tmp_path_factory, ascend):
    from infer.core.plugins import get_plugin_host

    path = tmp_path_factory.mktemp("llama")
    hf_tiny.save_tiny("llama", path)
    loaded = load_model(str(path), platform=ascend, host=get_plugin_host(), dtype="float16",
                        page_size=PAGE, skip_tokenizer_init=True, progress=False)
    cfg = EngineConfig(load=LoadConfig(model_path=str(path)), cache=CacheConfig(page_size=PAGE),
                       graph=GraphConfig(batch_sizes=[1, 2, 4]))
    return ModelRunner(loaded, cfg, num_pages=8, platform=ascend)


def _decode(seqs, step):
    """One decode row per sequence: (token, position, pages) -> DecodeInputs."""
    return DecodeInputs(
        input_ids=[(7 * i + 3 * step) % 90 for i, _ in enumerate(seqs)],
        positions=[n for n, _ in seqs], seq_lens=[n + 1 for n, _ in seqs],
        block_tables=[pages for _, pages in seqs],
        slot_mapping=[pages[n // PAGE] * PAGE + n % PAGE for n, pages in seqs])


def test_graph_replay_matches_eager_decode(runner):
    gr = runner.graph_runner
    assert type(gr).__name__ == "AclGraphRunner" and sorted(gr.graphs) == [1, 2, 4]
    # three sequences, prefilled token by token (eager), then decoded by graph and by eager
    seqs = [[0, [1, 2]], [0, [3]], [0, [4, 5]]]
    with torch.inference_mode():
        for step in range(140):
            live = [s for s in seqs if s[0] < (140, 60, 130)[seqs.index(s)]]
            fwd = runner.build_forward_batch(_decode(live, step))
            runner.attn_backend.plan(fwd.attn)
            runner.model(fwd)
            for s in live:
                s[0] += 1
        for step, batch in enumerate([seqs, seqs[:2], seqs[2:], seqs]):
            fwd = runner.build_forward_batch(_decode(batch, 1000 + step))
            assert gr.can_run(fwd)
            before = gr.replays
            graph_logits = gr.run(fwd)
            assert gr.replays == before + 1 and graph_logits.shape[0] == len(batch)
            runner.attn_backend.plan(fwd.attn)  # eager: same inputs, same cache slots rewritten
            eager = runner.model(fwd)
            # graph first: its own KV write must land in this step's slots before its attention
            # reads them (an eager step after it only rewrites the same values)
            torch.testing.assert_close(graph_logits.float(), eager.float(), atol=1e-3, rtol=1e-3)
            for s in batch:
                s[0] += 1
    prefill = runner.build_forward_batch(_decode(seqs, 0))
    prefill.attn.max_extend_len = 2  # not decode-only: the graphs do not cover it
    assert not gr.can_run(prefill)
