"""fp8 end to end on a CUDA GPU (sm89+): ``--kv-cache-dtype fp8_e4m3 / fp8_e5m2`` and
``--quantization fp8`` through the real loader and engine, CUDA graphs on. Skipped without a GPU.

Numerics use a well-conditioned tiny Llama (weights' std 0.05: bf16 vs fp32 logits differ by
1.2%) and teacher-forced logits (the same tokens fed to both runs, so one early argmax flip cannot
make the runs diverge). Bounds come from the CPU measurements of the same checkpoint and prompts
in test_fp8_cpu.py, with margin: KV cache torch_native 0.05 (e4m3) / 0.10 (e5m2), Triton under the
interpreter (truncating fp8 rounding) 0.11-0.16 / 0.18-0.23; --quantization fp8 0.12. A wrong
scale, layout or unquantized weight is off by ~1 or by < 1e-3, both outside the bounds."""

from __future__ import annotations

import pytest
import torch
from engine_utils import greedy, load, make_tiny_checkpoint, random_prompts, teacher_forced_logits
from kernel_utils import INTERPRET

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                       reason="needs a CUDA GPU (and TRITON_INTERPRET unset)"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="fp8 needs sm89+"),
]

PROMPTS = [7, 33, 1, 120, 64]  # prompt lengths: a decode batch of 5 pads to a captured 8
NEW = 24
VOCAB = 512
KV_BOUND = {"fp8_e4m3": 0.25, "fp8_e5m2": 0.4}
KV_DTYPE = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
QUANT_BOUND = 0.2


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("fp8_llama"), "llama",
                                initializer_range=0.05)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all(), "NaN/inf logits"
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("backend", ["triton", "torch_native"])
@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_logits_close_to_bf16_cache(llama_dir, kv, backend):
    """Prefill of 16 tokens, then 8 decode steps reading the fp8 cache, vs the bf16 cache."""
    tokens = random_prompts([24], seed=3)[0]
    ref = teacher_forced_logits(load(llama_dir, dtype="bfloat16", attention_backend=backend),
                                tokens, 16)
    loaded = load(llama_dir, dtype="bfloat16", attention_backend=backend, kv_cache_dtype=kv)
    assert loaded.arch.kv_dtype is KV_DTYPE[kv]
    err = _rel(teacher_forced_logits(loaded, tokens, 16), ref)
    assert 1e-3 < err < KV_BOUND[kv], err


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_engine_with_cuda_graphs(llama_dir, kv):
    """The real engine: fp8 pool, the default backend (triton with an fp8 cache, even where
    flashinfer is the default), captured decode graphs; every request gets its tokens."""
    seen = {}

    def inspect(core):
        seen["dtype"] = core.runner.kv_cache.k[0].dtype
        seen["backend"] = core.runner.attn_backend.name
        seen["graphs"] = core.runner.graph_runner is not None

    out = greedy(llama_dir, random_prompts(PROMPTS, seed=6), NEW, dtype="bfloat16",
                 kv_cache_dtype=kv, cuda_graph_max_bs=8, inspect=inspect)
    assert seen == {"dtype": KV_DTYPE[kv], "backend": "triton", "graphs": True}
    assert [len(o) for o in out] == [NEW] * len(PROMPTS)
    assert all(0 <= t < VOCAB for o in out for t in o)


def test_quantization_fp8_prefill_logits_close_to_bf16(llama_dir):
    from infer.core.model.layers.linear import LinearBase
    from infer_cuda.ops.linear_fp8 import Fp8LinearMethod

    tokens = random_prompts([40], seed=2)[0]
    ref = teacher_forced_logits(load(llama_dir, dtype="bfloat16", attention_backend="triton"),
                                tokens, 40)
    loaded = load(llama_dir, dtype="bfloat16", attention_backend="triton", quantization="fp8")
    layers = [m for m in loaded.model.modules() if isinstance(m, LinearBase)]
    assert layers and all(isinstance(m.method, Fp8LinearMethod) for m in layers)
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in layers)
    assert loaded.model.lm_head.weight.dtype == torch.bfloat16
    err = _rel(teacher_forced_logits(loaded, tokens, 40), ref)
    assert 1e-3 < err < QUANT_BOUND, err


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_quantization_fp8_engine_with_cuda_graphs(llama_dir, kv):
    seen = {}

    def inspect(core):
        seen["quant"] = core.loaded.ctx.quantization
        seen["graphs"] = core.runner.graph_runner is not None

    out = greedy(llama_dir, random_prompts(PROMPTS, seed=7), NEW, dtype="bfloat16",
                 quantization="fp8", kv_cache_dtype=kv, attention_backend="triton",
                 cuda_graph_max_bs=8, inspect=inspect)
    assert seen == {"quant": "fp8", "graphs": True}
    assert [len(o) for o in out] == [NEW] * len(PROMPTS)
    assert all(0 <= t < VOCAB for o in out for t in o)
