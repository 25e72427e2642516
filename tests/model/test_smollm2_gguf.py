"""SmolLM2-135M-Instruct (Q4_1 GGUF, the default model) against transformers loading the same
GGUF in fp32: greedy continuations of three chat prompts, 32 tokens each, identical."""

from __future__ import annotations

import gguf
import pytest
import torch
from infer.core.model.loader import load_model
from infer.core.model.loader.default_model import ensure_default_model
from infer.core.model.loader.gguf_quants import dequantize

from .driver import PagedDriver, run_greedy

pytestmark = pytest.mark.slow

CHATS = ["What is the capital of France?", "Write a haiku about the sea.",
         "Explain in one sentence what a CPU does."]


@pytest.fixture(scope="module")
def smollm2(host, cpu):
    path = ensure_default_model(quiet=True)
    # explicit float32: the dense, exact path (the default takes the quantized GGUF fast path)
    return path, load_model(str(path), platform=cpu, host=host, progress=False, dtype="float32")


def test_metadata(smollm2):
    _, loaded = smollm2
    assert loaded.arch.num_layers == 30 and loaded.arch.num_kv_heads == 3
    assert loaded.arch.dtype == torch.float32
    assert loaded.chat_template and "<|im_start|>" in loaded.chat_template
    assert loaded.tokenizer.convert_ids_to_tokens(loaded.eos_token_ids[0]) == "<|im_end|>"


def test_gguf_raw_blocks_reachable(smollm2):
    """The GGUF seam: a Q4_1 projection keeps its raw blocks (q/k rows un-permuted too)."""
    _, loaded = smollm2
    attn = loaded.model.model.layers[0].self_attn
    for layer in (attn.qkv_proj, attn.o_proj, loaded.model.model.layers[3].mlp.gate_up_proj):
        assert layer.gguf_qtype == gguf.GGMLQuantizationType.Q4_1
        deq = dequantize(layer.gguf_raw, layer.gguf_qtype, tuple(layer.weight.shape))
        torch.testing.assert_close(deq, layer.weight, rtol=0, atol=0)


def test_greedy_matches_transformers(smollm2):
    from transformers import AutoModelForCausalLM

    path, loaded = smollm2
    tok = loaded.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for c in CHATS]
    gen, _ = run_greedy(PagedDriver(loaded, page_size=16, num_pages=64), prompts, 32, chunk=16)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    for p, g in zip(prompts, gen, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False,
                              eos_token_id=[], pad_token_id=0)[0, len(p):].tolist()
        assert g == ref, f"infer {tok.decode(g)!r} != transformers {tok.decode(ref)!r}"
