"""Greedy answers of the default model (SmolLM2-135M Q4_1 GGUF, default settings) do not depend
on the prefix cache, on chunked prefill or on the batch: the same requests cold, warm (a prefix
cache hit), chunked (8-token chunks), alone and in batches of 2 to 48 (admitted together, or one
per step so prefills share steps with other requests' decodes) give the same tokens, and with
``--enable-deterministic-inference`` as well (issue 13 item 1)."""

from __future__ import annotations

import pytest
from infer.core.config import ServerArgs
from infer.core.engine.engine_core import EngineCore
from infer.core.model.loader.default_model import ensure_default_model

pytestmark = pytest.mark.slow

CHATS = ["What is the capital of France?", "Write a haiku about the sea.",
         "Explain in one sentence what a CPU does.", "List three prime numbers.",
         "Who wrote Hamlet?", "Translate 'good morning' into Spanish."]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def default_core():
    return EngineCore(ServerArgs(model_path=str(ensure_default_model(quiet=True)),
                                 max_total_tokens=8192))


@pytest.fixture(scope="module")
def prompts(default_core):
    tok = default_core.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"] for c in CHATS]


def _run(core: EngineCore, jobs: list[list[int]], tag: str, stagger: bool = False
         ) -> tuple[list[list[int]], list[int]]:
    """Greedy tokens and cached prompt tokens of each job; ``stagger``: one job admitted per
    step, so prefills run in steps with other jobs' decodes."""
    rids = [f"{tag}-{i}" for i in range(len(jobs))]
    out: dict[str, list[int]] = {r: [] for r in rids}
    cached: dict[str, int] = {}
    todo = list(zip(rids, jobs, strict=True))
    while todo or core.has_work():
        for rid, ids in (todo[:1] if stagger else todo):
            core.add_request(core.make_request(rid, ids, {"max_new_tokens": NEW_TOKENS,
                                                          "temperature": 0.0, "ignore_eos": True}))
        todo = todo[1:] if stagger else []
        for o in core.step():
            out[o.rid] += o.new_token_ids
            if o.finished:
                cached[o.rid] = o.cached_tokens
    return [out[r] for r in rids], [cached[r] for r in rids]


def _alone_cold(core: EngineCore, prompts: list[list[int]], tag: str) -> list[list[int]]:
    res = []
    for i, p in enumerate(prompts):
        core.flush_cache()
        toks, cached = _run(core, [p], f"{tag}{i}")
        assert cached == [0]
        res += toks
    return res


@pytest.fixture(scope="module")
def reference(default_core, prompts):
    return _alone_cold(default_core, prompts, "cold")


def test_warm_cache_hits_give_the_same_tokens(default_core, prompts, reference):
    for i, p in enumerate(prompts):
        _run(default_core, [p], f"seed{i}")  # leaves the prompt (and answer) in the cache
        toks, cached = _run(default_core, [p], f"warm{i}")
        assert cached[0] >= len(p) - 1
        assert toks[0] == reference[i], CHATS[i]


@pytest.mark.parametrize("size,stagger", [(2, False), (7, True), (48, False), (48, True)])
def test_batches_give_the_same_tokens(default_core, prompts, reference, size, stagger):
    default_core.flush_cache()
    jobs = [i % len(prompts) for i in range(size)]
    toks, _ = _run(default_core, [prompts[j] for j in jobs], f"b{size}{stagger}", stagger)
    for j, t in zip(jobs, toks, strict=True):
        assert t == reference[j], (size, stagger, CHATS[j])


def test_chunked_prefill_gives_the_same_tokens(default_core, prompts, reference):
    core = EngineCore(ServerArgs(model_path=default_core.args.model_path, max_total_tokens=8192,
                                 chunked_prefill_size=8), loaded=default_core.loaded)
    assert _alone_cold(core, prompts[:2], "chunk") == reference[:2]
    toks, _ = _run(core, prompts, "chunkb", stagger=True)
    assert toks == reference


def test_deterministic_flag_gives_the_same_tokens(default_core, prompts, reference):
    core = EngineCore(ServerArgs(model_path=default_core.args.model_path, max_total_tokens=8192,
                                 enable_deterministic_inference=True, chunked_prefill_size=16))
    toks, _ = _run(core, [prompts[i % len(prompts)] for i in range(8)], "det", stagger=True)
    assert toks == [reference[i % len(prompts)] for i in range(8)]
    assert _alone_cold(core, prompts[:2], "detc") == reference[:2]
