"""``--torchao-config int8wo``: per-row int8 weights on torch's CPU int8 kernel, against the dense
float32 model with the same weights; other torchao schemes are refused by the start-up gate."""

from __future__ import annotations

import pytest
import torch
from infer.core.config import ServerArgs
from infer.core.config.gate import run_gate
from infer.core.model.layers.linear import LinearBase
from infer.core.model.loader import load_model
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def test_int8wo_layers_match_dense_weights(tiny):
    kw = {"dtype": "float32", "skip_tokenizer_init": True, "progress": False}
    dense = load_model(tiny, **kw)
    quant = load_model(tiny, torchao_config="int8wo", **kw)
    assert quant.ctx.quantization == "torchao:int8wo"
    pairs = [(d, q) for d, q in zip(dense.model.modules(), quant.model.modules(), strict=True)
             if isinstance(d, LinearBase)]
    assert len(pairs) == 8
    for d, q in pairs:
        assert q.weight is None and q.int8_q.dtype == torch.int8
        w = q.int8_q.float() * q.int8_scale.float().unsqueeze(1)
        assert ((w - d.weight).norm() / d.weight.norm()) < 1e-2
        xin = torch.randn(3, d.in_features)
        ref = d(xin)
        assert ((q(xin) - ref).norm() / ref.norm()) < 2e-2


def test_gate_accepts_int8wo_and_loading_refuses_other_schemes(tiny):
    # the gate sees the flag only (free string): it runs, with the matrix's note on which scheme works
    warnings = run_gate(ServerArgs(model_path=tiny, torchao_config="int8wo")).warnings
    assert any("only int8wo" in w for w in warnings)
    with pytest.raises(NotImplementedError, match=r"--torchao-config int4wo-128 .*available: int8wo"):
        load_model(tiny, torchao_config="int4wo-128", skip_tokenizer_init=True, progress=False)


def test_torchao_with_quantization_is_an_error(tiny):
    with pytest.raises(ValueError, match="cannot be combined"):
        load_model(tiny, torchao_config="int8wo", quantization="gguf", skip_tokenizer_init=True,
                   progress=False)
