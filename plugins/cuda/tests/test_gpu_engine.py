"""End to end on a CUDA GPU: greedy tokens identical across attention backends, MoE runners and
CUDA graph on/off; fp8 GEMM against its reference. Skipped without a GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from engine_utils import greedy, make_tiny_checkpoint, random_prompts
from kernel_utils import INTERPRET

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                       reason="needs a CUDA GPU (and TRITON_INTERPRET unset)"),
]

PROMPTS = [7, 33, 1, 120, 64]  # prompt lengths: a decode batch of 5 pads to a captured 8
NEW = 24


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_mixtral"), "mixtral")


def test_fp32_greedy_identical_triton_torch_native_and_graphs(llama_dir):
    prompts = random_prompts(PROMPTS)
    ref = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="torch_native",
                 disable_cuda_graph=True)
    eager = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                   disable_cuda_graph=True)
    graphed = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                     cuda_graph_max_bs=8)
    paged = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                   cuda_graph_max_bs=8, page_size=16)
    assert all(len(r) == NEW for r in ref)
    assert eager == ref
    assert graphed == ref
    assert paged == ref


def test_torch_compile_graphs_match_eager(llama_dir):
    prompts = random_prompts(PROMPTS, seed=5)
    ref = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                 disable_cuda_graph=True)
    compiled = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                      cuda_graph_bs=[8], enable_torch_compile=True, torch_compile_max_bs=8)
    assert compiled == ref


def test_graph_padding_off_matches(llama_dir):
    prompts = random_prompts(PROMPTS, seed=1)
    ref = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                 disable_cuda_graph=True)
    exact = greedy(llama_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                   cuda_graph_bs=[1, 2, 4, 8], disable_cuda_graph_padding=True)
    assert exact == ref


def test_transformers_agrees(llama_dir):
    import transformers as tf

    prompt = random_prompts([40], seed=2)[0]
    ours = greedy(llama_dir, [prompt], NEW, dtype="float32", attention_backend="triton")[0]
    hf = tf.LlamaForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW, do_sample=False,
                          min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    assert ours == out[0, len(prompt):].tolist()


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                    reason="flashinfer-python is not installed")
def test_bf16_flashinfer_matches_triton_and_torch_native(llama_dir):
    """FlashInfer runs bf16 only, so the three backends are compared in bf16."""
    prompts = random_prompts(PROMPTS, seed=3)
    ref = greedy(llama_dir, prompts, 8, dtype="bfloat16", attention_backend="torch_native",
                 disable_cuda_graph=True)
    fi = greedy(llama_dir, prompts, 8, dtype="bfloat16", attention_backend="flashinfer")
    tr = greedy(llama_dir, prompts, 8, dtype="bfloat16", attention_backend="triton")
    assert fi == ref
    assert tr == ref


def test_mixtral_triton_moe_matches_torch_moe(mixtral_dir):
    prompts = random_prompts(PROMPTS, seed=4)
    ref = greedy(mixtral_dir, prompts, NEW, dtype="float32", attention_backend="torch_native",
                 moe_runner_backend="torch", disable_cuda_graph=True)
    ours = greedy(mixtral_dir, prompts, NEW, dtype="float32", attention_backend="triton",
                  moe_runner_backend="triton", cuda_graph_max_bs=8)
    assert ours == ref


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 GEMMs need sm89+")
@pytest.mark.parametrize("m", [1, 7, 64])
def test_fp8_linear(m):
    from infer.core.ops.linear import LinearConfig
    from infer_cuda.ops.linear_fp8 import Fp8LinearMethod
    from torch import nn

    method = Fp8LinearMethod(LinearConfig("fp8", torch.bfloat16, torch.device("cuda")))
    layer = nn.Module()
    method.create_weights(layer, 512, 256, bias=True)
    w = torch.randn(256, 512, device="cuda") * torch.rand(256, 1, device="cuda")
    layer.weight.data.copy_(w)
    layer.bias.data.copy_(torch.randn(256, device="cuda"))
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    dense = (x.double() @ w.bfloat16().double().T + layer.bias.double())
    method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.float8_e4m3fn
    y = method.apply(layer, x)
    assert y.shape == (m, 256) and y.dtype == torch.bfloat16
    # the GEMM itself: exact against the dequantized operands it was given. At 1-8 rows the
    # method may have picked the Triton GEMV, which reads x unquantized (the cached choice says)
    from infer_cuda.kernels import gemv as gemv_kernel
    from infer_cuda.ops.linear_dense import small_m_rows
    from infer_cuda.ops.linear_fp8 import quantize_rows, scaled_mm_baseline

    gemv = small_m_rows(x) and gemv_kernel.pick(
        m, 256, 512, x.dtype, x.device, layer.weight, layer.weight_scale,
        baseline=scaled_mm_baseline) != "cublas"
    if gemv:
        xd = x.double()
    else:
        xq, xs = quantize_rows(x)
        xd = xq.double() * xs.double()
    exact = xd @ (layer.weight.double() * layer.weight_scale.double().T).T
    exact = exact + layer.bias.double()
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-2
    # and close to the unquantized layer (fp8's 3 mantissa bits)
    assert ((y.double() - dense).norm() / dense.norm()).item() < 6e-2
