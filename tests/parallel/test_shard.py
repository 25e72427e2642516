"""How a rank's shard is chosen (infer.core.model.layers.shard), the start-up checks of tp/ep
against a model's shapes, and shard reads of GGUF blocks. In-process, no ranks."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from infer.core.config.flags import ConfigError
from infer.core.model.layers.shard import (
    ExpertShard,
    check_model_split,
    even_split,
    kv_head_slice,
    vocab_slice,
)
from infer.core.model.loader.gguf_quants import dequantize
from infer.core.model.loader.gguf_reader import unpermute
from infer.core.model.loader.weights import GGUFShardError, GGUFTensor


def LlamaConfig(**kw):  # noqa: N802 (the config's shape fields only)
    return SimpleNamespace(**{"num_attention_heads": 32, "num_key_value_heads": 8,
                              "intermediate_size": 11008, **kw})


def MixtralConfig(**kw):  # noqa: N802
    return LlamaConfig(**{"intermediate_size": 14336, "num_local_experts": 8, **kw})


Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("heads,kv,tp", [(8, 8, 2), (8, 2, 2), (8, 2, 4), (8, 2, 8), (12, 3, 6),
                                         (4, 1, 2), (32, 8, 16)])
def test_each_rank_holds_the_kv_heads_its_query_heads_read(heads, kv, tp):
    group = heads // kv  # GQA: query head h reads KV head h // group
    for rank in range(tp):
        q = even_split(heads, tp, rank)
        k = kv_head_slice(kv, tp, rank)
        needed = {h // group for h in range(q.start, q.start + q.size)}
        assert needed == set(range(k.start, k.start + k.size))


def test_vocab_rows_cover_the_vocabulary_once():
    for vocab, tp in [(97, 2), (97, 4), (49152, 3), (5, 4)]:
        rows = [vocab_slice(vocab, tp, r) for r in range(tp)]
        assert all(per == -(-vocab // tp) for _, per in rows)
        covered = [i for s, _ in rows for i in range(s.start, s.start + s.size)]
        assert covered == list(range(vocab))


@pytest.mark.parametrize("tp,ep", [(2, 1), (2, 2), (4, 2), (4, 4)])
def test_expert_shards_cover_every_expert_row_once(tp, ep):
    experts, inter = 8, 64
    seen = torch.zeros(experts, inter, dtype=torch.int32)
    for rank in range(tp):
        s = ExpertShard.for_rank(experts, inter, tp, rank, ep)
        seen[s.first_expert:s.first_expert + s.num_experts,
             s.inter.start:s.inter.start + s.inter.size] += 1
    assert (seen == 1).all()


def _llama(**kw):
    return LlamaConfig(num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, **kw)


@pytest.mark.parametrize("config,tp,ep,match", [
    (_llama(), 2, 1, r"--tp-size 2 does not divide the model's 9 attention heads"),
    (LlamaConfig(num_attention_heads=12, num_key_value_heads=3), 4, 1,
     r"--tp-size 4 and the model's 3 KV heads"),
    (LlamaConfig(num_attention_heads=8, num_key_value_heads=8, intermediate_size=100), 8, 1,
     r"intermediate size 100"),
    (_llama(), 3, 3, r"--ep-size 3: the model has no experts"),
    (MixtralConfig(num_local_experts=6), 4, 4, r"--ep-size 4 does not divide the model's 6 experts"),
    (MixtralConfig(num_local_experts=8), 2, 4, r"--ep-size 4 must divide --tp-size 2"),
    (MixtralConfig(num_local_experts=8, intermediate_size=100), 8, 1,
     r"splits each expert 8 ways, which does not divide the expert intermediate size 100"),
])
def test_bad_split_is_a_config_error_naming_the_values(config, tp, ep, match):
    with pytest.raises(ConfigError, match=match):
        check_model_split(config, tp, ep)


def test_good_splits_pass():
    check_model_split(_llama(), 3)  # SmolLM2-135M's shapes at tp=3
    check_model_split(LlamaConfig(num_attention_heads=32, num_key_value_heads=8), 16)  # replicated
    check_model_split(MixtralConfig(num_local_experts=8), 4, 2)


def test_load_model_refuses_a_bad_split_before_reading_weights(tmp_path, monkeypatch):
    from hf_tiny import save_tiny
    from infer.core.model.loader import load_model, weights
    from infer.core.plugins import get_plugin_host

    save_tiny("llama", tmp_path)  # 4 heads, 2 KV heads

    def no_read(*a, **k):
        raise AssertionError("weights were read")

    monkeypatch.setattr(weights, "iter_safetensors", no_read)
    host = get_plugin_host()
    with pytest.raises(ConfigError, match="--tp-size 3 does not divide the model's 4 attention"):
        load_model(str(tmp_path), platform=host.select("cpu"), host=host, tp_size=3, tp_rank=0,
                   skip_tokenizer_init=True, progress=False)


def _q4_1_blocks(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random valid Q4_1 blocks of a [rows, cols] weight: uint8 [rows, cols / 32 * 20]."""
    rng = np.random.default_rng(seed)
    nb = cols // 32
    d = rng.uniform(0.01, 0.1, (rows, nb, 1)).astype(np.float16).view(np.uint8)
    m = rng.uniform(-0.5, 0.5, (rows, nb, 1)).astype(np.float16).view(np.uint8)
    qs = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    return np.concatenate([d, m, qs], axis=-1).reshape(rows, -1)


def test_gguf_shard_reads_the_slice_of_the_full_weight():
    data = _q4_1_blocks(8, 128)
    full = dequantize(torch.from_numpy(data), Q.Q4_1, (8, 128))
    t = GGUFTensor("w", data, Q.Q4_1, (8, 128))
    part = t.narrow(0, 2, 4).narrow(1, 64, 64).load()
    torch.testing.assert_close(part, full[2:6, 64:128], rtol=0, atol=0)
    assert part.gguf_qtype == Q.Q4_1 and part.gguf_raw.shape == (4, 2 * 20)
    # rows of whole heads of a llama.cpp-permuted q weight: unpermuted per slice
    heads = GGUFTensor("q", data, Q.Q4_1, (8, 128), unpermute_heads=4)
    ref = unpermute(full, 4)
    torch.testing.assert_close(heads.narrow(0, 4, 4).load(), ref[4:8], rtol=0, atol=0)


def test_gguf_split_off_a_block_boundary_names_the_values():
    t = GGUFTensor("blk.0.ffn_down.weight", _q4_1_blocks(4, 96), Q.Q4_1, (4, 96))
    with pytest.raises(GGUFShardError, match=r"ffn_down.*Q4_1, blocks of 32.*96 input columns.*"
                                             r"\[48, 96\)"):
        t.narrow(1, 48, 48).load()
