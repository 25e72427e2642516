"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) at its default precision, i.e. on the CPU
plugin's native block kernels, split over 3 ranks (spawned, gloo, one thread each) gives the
greedy tokens of one rank. tp=3, not 2: the model has 9 query heads and 3 KV heads, which 2 does
not divide (that is a start-up error, tested in test_shard.py); at 3 every split of a weight's
input columns (576/3, 1536/3) falls on a 32-weight block boundary, so each rank's kernels read
the file's blocks as they are. Both paths run: the per-op path and the native decode graph (each
decode step one native call, the all-reduces in C), close to one rank's logits, and equal to
each other bit for bit on each rank.

How close depends on the activation precision, since the split reorders the row-parallel layers'
sums (each rank sums its blocks, the all-reduce the ranks' partials): float32 activations chain
one FMA per weight over dequantized weights (1.2e-6 of the logits' scale measured); the integer
paths (int16, the default) add d * dot(q, x) and m * sum(x) per Q4_1 block, two terms that nearly
cancel (m ~ -8 d), so a reordered sum moves further (2.2e-4 measured) -- still far below what a
wrong shard, head or all-reduce gives (the tokens differ). Those figures are for a float32 KV
cache; the default now keeps an fp16 one (CpuPlatform.gguf_kv_dtype), and where a reordered sum
moves a key or value across an fp16 rounding boundary, that element changes by one fp16 ulp
(2^-10 relative). Measured with the fp16 cache: below 1e-3 on Zen 3, 1.15e-3 on an Intel Xeon
(AVX-512 VNNI paths; the same at b8dcc75, before that session's kernel changes). How much of it
is the cache and how much the int16 sums was not separated there."""

from __future__ import annotations

import pytest
import torch
from infer.core.model.loader.default_model import ensure_default_model
from ranks import run_ranks
from tp_worker import native_greedy_on_rank

pytestmark = pytest.mark.slow

CHATS = ["What is the capital of France?", "Write a haiku about the sea."]
MAX_NEW = 16


def test_default_model_tp3_native_kernels_and_graph_match_one_rank():
    from infer_cpu import kernels
    from transformers import AutoTokenizer

    if kernels.load() is None:
        pytest.skip(f"native kernels unavailable: {kernels.status().detail}")
    path = ensure_default_model(quiet=True)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for c in CHATS]
    tol = 3e-3  # the fp16 cache's flipped roundings (see above); any activation precision
    ranks = run_ranks(native_greedy_on_rank, 3, str(path), prompts, MAX_NEW)
    ref = run_ranks(native_greedy_on_rank, 1, str(path), prompts, MAX_NEW)[0]
    assert ref["kinds"] == {"native"} and ref["graph_steps"] > 0
    ref_gen = ref["per_op"][0]
    assert ref["graph"][0] == ref_gen  # one rank: the graph is the per-op path, bit for bit
    for rank, r in enumerate(ranks):
        assert r["kinds"] == {"native"}, f"rank {rank} ran {r['kinds']} linear layers"
        assert r["route"] == "native (shared memory, in C)"
        assert r["graph_steps"] == ref["graph_steps"]
        for path_name in ("per_op", "graph"):
            gen, logits = r[path_name]
            assert gen == ref_gen, (f"rank {rank} ({path_name}): {[tok.decode(g) for g in gen]} "
                                    f"!= one rank {[tok.decode(g) for g in ref_gen]}")
            for i, (got, want) in enumerate(zip(logits, ref["per_op"][1], strict=True)):
                err = ((got - want).abs().max() / want.abs().max()).item()
                assert err < tol, f"rank {rank} ({path_name}) seq {i}: logits error {err:.2e}"
        # on the same shard the graph and the per-op path agree exactly
        assert all(torch.equal(a, b) for a, b in zip(r["graph"][1], r["per_op"][1], strict=True))
