"""Each architecture against transformers on the same tiny random weights, fp32: logits of
prefill, chunked prefill and decode rows through the paged cache (page sizes 1 and 4) agree to
relative error < 1e-4, and 32-token greedy continuations are identical."""

from __future__ import annotations

import pytest
import torch
from infer.core.model.loader import load_model

from .driver import PagedDriver, run_greedy
from .hf_tiny import save_tiny

ARCHS = ["llama", "llama_tied", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"]
PROMPT_LENS = [5, 13, 22]
MAX_NEW = 32


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation (its own KV cache, no eos stop)."""
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                      eos_token_id=[], pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = save_tiny(request.param, path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=gen).tolist()
               for n in PROMPT_LENS]
    with torch.no_grad():
        greedy = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
        full_logits = [hf(torch.tensor([p + g])).logits[0] for p, g in zip(prompts, greedy, strict=True)]
    return request.param, path, prompts, greedy, full_logits


@pytest.mark.parametrize("page_size,chunk", [(1, 64), (4, 4), (4, 7)])
def test_logits_and_greedy_match_transformers(tiny, host, cpu, page_size, chunk):
    arch, path, prompts, greedy, full_logits = tiny
    loaded = load_model(str(path), platform=cpu, host=host, dtype="float32", page_size=page_size,
                        skip_tokenizer_init=True, progress=False)
    driver = PagedDriver(loaded, page_size)
    gen, logits = run_greedy(driver, prompts, MAX_NEW, chunk=chunk)
    for i, (p, g) in enumerate(zip(prompts, greedy, strict=False)):
        n = len(p) + MAX_NEW - 1  # positions processed: prompt + all but the last generated token
        assert logits[i].shape == (n, loaded.arch.vocab_size)
        err = rel_err(logits[i], full_logits[i][:n])
        assert err < 1e-4, f"{arch} seq {i}: relative logits error {err:.2e}"
        assert gen[i] == g, f"{arch} seq {i}: greedy continuation differs"


def test_single_batch_full_prefill(tiny, host, cpu):
    """All prompts prefilled in one batch, logits of every row."""
    arch, path, prompts, _, full_logits = tiny
    loaded = load_model(str(path), platform=cpu, host=host, dtype="float32",
                        skip_tokenizer_init=True, progress=False)
    out = PagedDriver(loaded, 1).step(list(enumerate(prompts)))
    for i, p in enumerate(prompts):
        assert rel_err(out[i], full_logits[i][:len(p)]) < 1e-4


def test_backend_that_fuses_rotary_gets_unrotated_qk_and_the_table(tiny, host, cpu):
    """A backend with ``fuses_rotary`` is handed q/k before rotary plus the rotary table, and
    applying that table itself reproduces transformers' logits (wrong positions, table or
    rotary_dim would not)."""
    from infer.core.ops.layer_ops import rotary_ref
    from infer_cpu.ops.attention import TorchNativeAttention

    arch, path, prompts, _, full_logits = tiny
    loaded = load_model(str(path), platform=cpu, host=host, dtype="float32",
                        skip_tokenizer_init=True, progress=False)
    calls = []

    class RotatingBackend(TorchNativeAttention):
        fuses_rotary = True

        def forward(self, q, k, v, k_cache, v_cache, layer_id, rotary=None):
            calls.append(rotary)
            q, k = rotary_ref(rotary.positions, q, k, rotary.cos_sin, rotary.rotary_dim)
            return super().forward(q, k, v, k_cache, v_cache, layer_id)

    loaded.ctx.attn_backend = RotatingBackend(loaded.ctx.attn_backend.config)
    out = PagedDriver(loaded, 4).step(list(enumerate(prompts)))
    assert len(calls) == loaded.arch.num_layers and all(c is not None for c in calls)
    for i, p in enumerate(prompts):
        assert rel_err(out[i], full_logits[i][:len(p)]) < 1e-4
