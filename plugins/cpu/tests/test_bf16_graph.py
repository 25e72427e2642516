"""bf16 models end to end on the CPU plugin: the dense linear method packs the weights for the
native bf16 GEMM, the native_decode graph runs the bf16 stack over a bf16 KV cache, and greedy
continuations follow transformers in float32 on the same (bf16) weights.

A bf16 path cannot match a float32 reference token for token where two candidates are nearly
tied, so each generated token is checked teacher-forced: transformers (float32) run over prompt +
infer's tokens must rank infer's choice within ``TIE`` of its best logit at every step. A wrong
kernel (see test_bf16_kernels.py's mutations) misses that by whole logits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from infer_cpu.kernels import bf16 as kb

pytestmark = pytest.mark.skipif(kb.load() is None, reason=f"bf16 kernels unavailable: {kb.detail()}")

TESTS = Path(__file__).parents[3] / "tests"
TIE = 0.15  # logits: bf16 rounding of weights' products and activations, summed over a model


def _shortfall(hf, prompt: list[int], got: list[int]) -> float:
    """max over steps of (best logit - logit of infer's token), transformers float32 teacher-forced."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + got])).logits[0, len(prompt) - 1:-1].double()
    chosen = logits.gather(1, torch.tensor(got)[:, None])[:, 0]
    return (logits.max(1).values - chosen).max().item()


def _tiny(tmp_path: Path, arch: str):
    """A tiny random checkpoint of ``arch`` in bf16 with a real tokenizer; returns the float32
    transformers model on the same (bf16-exact) weights."""
    sys.path[:0] = [str(TESTS / "model"), str(TESTS / "server")]
    from hf_tiny import save_tiny
    from tiny_model import make_tokenizer

    tok = make_tokenizer(tmp_path)
    hf = save_tiny(arch, tmp_path, dtype=torch.bfloat16, vocab_size=len(tok) + 8,
                   intermediate_size=160)
    gen = torch.Generator().manual_seed(3)
    for name, p in hf.named_parameters():
        if name.endswith("bias"):  # transformers initialises biases to zero: make them count
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    hf.save_pretrained(tmp_path)
    return hf.float().eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: qkv bias
def test_tiny_bf16_models_decode_through_the_graph(tmp_path, greedy, arch):
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    hf = _tiny(tmp_path, arch)
    prompts = [list(range(5, 12)), list(range(40, 61)), list(range(100, 103)), [7] * 9]
    counts = [24, 24, 10, 17]  # batches of 4, 3 and 2 rows
    core = EngineCore(ServerArgs(model_path=str(tmp_path), dtype="bfloat16", page_size=4,
                                 max_total_tokens=1024))
    runner = core.runner.graph_runner
    assert runner is not None and runner.ok, getattr(runner, "reason", None)
    qkv = core.runner.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.bf16_packed, kb.PackedBF16) and qkv.weight is None
    calls = {"n": 0}
    run = runner.run

    def counted(batch):
        calls["n"] += 1
        return run(batch)

    runner.run = counted
    extend = {"n": 0}
    run_extend = runner._bf16.run_extend

    def counted_extend(batch):
        extend["n"] += 1
        return run_extend(batch)

    runner._bf16.run_extend = counted_extend
    got = greedy(core, prompts, counts)
    assert calls["n"] >= 23  # every decode step went through the graph
    assert extend["n"] >= 1  # and the prefills through the bf16 stack's extend path
    for p, g in zip(prompts, got, strict=True):
        assert _shortfall(hf, p, g) < TIE


def test_bf16_per_op_path_uses_the_packed_weights(tmp_path, greedy):
    """--disable-cuda-graph: the per-op path (bf16 residual stream, reference attention) on the
    same packed weights."""
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    hf = _tiny(tmp_path, "llama")
    core = EngineCore(ServerArgs(model_path=str(tmp_path), dtype="bfloat16", page_size=4,
                                 max_total_tokens=512, disable_cuda_graph=True))
    assert core.runner.graph_runner is None
    assert core.runner.model.lm_head.bf16_packed is not None
    prompts = [list(range(20, 33)), list(range(60, 65))]
    for p, g in zip(prompts, greedy(core, prompts, 20), strict=True):
        assert _shortfall(hf, p, g) < TIE


def test_float32_models_keep_the_reference_linear(tmp_path):
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    _tiny(tmp_path, "llama")
    core = EngineCore(ServerArgs(model_path=str(tmp_path), dtype="float32", max_total_tokens=512))
    qkv = core.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.bf16_packed is None and qkv.weight.dtype == torch.float32
    assert "dense linear layer" in core.runner.graph_runner.reason


@pytest.mark.slow
def test_smollm2_bf16_greedy_follows_transformers(greedy):
    """The default model's weights served in bf16 (--dtype bfloat16 on the GGUF: dequantised,
    rounded to bf16): three chat prompts, 32 tokens each, against transformers float32 on the
    same bf16-rounded weights."""
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.loader.default_model import ensure_default_model
    from transformers import AutoModelForCausalLM

    path = ensure_default_model(quiet=True)
    core = EngineCore(ServerArgs(model_path=str(path), dtype="bfloat16", page_size=16))
    assert core.runner.graph_runner.ok, core.runner.graph_runner.reason
    tok = core.runner.loaded.tokenizer
    chats = ["What is the capital of France?", "Write a haiku about the sea.",
             "Explain in one sentence what a CPU does."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for c in chats]
    got = greedy(core, prompts, 32)
    del core
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    for p in hf.parameters():
        p.data = p.data.bfloat16().float()
    assert "Paris" in tok.decode(got[0])
    for p, g in zip(prompts, got, strict=True):
        assert _shortfall(hf, p, g) < TIE, tok.decode(g)
