"""The default model's fast path (GGUF Q4_1 blocks on the native Q4 x Q8 kernels, Q8 LM head;
torch's int4 kernels when the native ones are off) against the exact float32 path on the same
file: same greedy continuations for the first tokens."""

from __future__ import annotations

import collections
import functools

import pytest

pytestmark = pytest.mark.slow

CHATS = ["What is the capital of France?", "Write a haiku about the sea."]


@pytest.fixture(scope="module", autouse=True)
def _parse_gguf_once():
    """Every load here reads the same GGUF file, and a load parses its header (the tokenizer's
    49k-entry metadata) up to three times (the checkpoint, the config, the tokenizer): about 3 s
    a parse on a 2-core machine. The parse (gguf.GGUFReader, read-only memory map) is shared
    across this module's loads; everything after it (config, weights, packing, the settings under
    test) still runs in each load."""
    import gguf

    parse = functools.lru_cache(maxsize=4)(gguf.GGUFReader)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", lambda path, mode="r": parse(str(path), mode))
        yield
    parse.cache_clear()


@pytest.fixture(scope="module")
def float32_reference():
    """``reference(greedy)``: (prompts, greedy continuations) of the exact float32 path on the
    default model, the one reference both fast paths are compared with: built by the first
    caller (before it turns any kernel off) and kept for the module."""
    cache = []

    def reference(greedy):
        if not cache:
            from infer.core.config import ServerArgs
            from infer.core.engine.engine_core import EngineCore
            from infer.core.model.loader.default_model import ensure_default_model

            path = str(ensure_default_model(quiet=True))
            exact = EngineCore(ServerArgs(model_path=path, dtype="float32"))
            assert exact.loaded.ctx.quantization is None
            tok = exact.tokenizer
            prompts = [tok.apply_chat_template([{"role": "user", "content": c}],
                                               add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"] for c in CHATS]
            cache.append((prompts, greedy(exact, prompts, 12)))
        return cache[0]

    return reference


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch-int4"])
def test_default_gguf_takes_fast_path_and_agrees_with_float32(native, monkeypatch, greedy,
                                                              float32_reference):
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.loader.default_model import ensure_default_model
    from infer_cpu import kernels

    if native and kernels.load() is None:
        pytest.skip(f"native kernels unavailable: {kernels.status().detail}")
    prompts, ref = float32_reference(greedy)
    if not native:
        monkeypatch.setattr(kernels, "_state", {"lib": None, "detail": "off for this test"})
    path = str(ensure_default_model(quiet=True))
    fast = EngineCore(ServerArgs(model_path=path))
    assert fast.loaded.ctx.quantization == "gguf"
    kinds = collections.Counter(getattr(m, "quant_kind", None)
                                for m in fast.loaded.model.modules() if hasattr(m, "method"))
    assert kinds == {("native" if native else "int4"): 120}
    assert fast.loaded.model.lm_head.quant_apply is not None
    tok = fast.tokenizer
    got = greedy(fast, prompts, 12)
    for g, r in zip(got, ref, strict=True):
        same = next((i for i, (a, b) in enumerate(zip(g, r, strict=True)) if a != b), len(r))
        assert same >= 6, f"fast {tok.decode(g)!r} vs float32 {tok.decode(r)!r}"


def test_explicit_quantization_gguf(tmp_path):
    import torch
    from infer.core.model.loader import load_model
    from infer.core.model.loader.default_model import ensure_default_model
    from transformers import LlamaConfig, LlamaForCausalLM

    path = str(ensure_default_model(quiet=True))
    loaded = load_model(path, quantization="gguf", dtype="bfloat16", progress=False,
                        skip_tokenizer_init=True)
    assert loaded.ctx.quantization == "gguf" and loaded.arch.dtype == torch.bfloat16
    assert loaded.model.model.layers[0].mlp.down_proj.quant_kind == "int4"
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError, match="--quantization gguf needs a GGUF file"):
        load_model(str(tmp_path), quantization="gguf", progress=False, skip_tokenizer_init=True)


def test_activation_precision_setting(monkeypatch):
    """INFER_CPU_ACTIVATIONS=int8 / int16 / float32: every native GEMM of the default model (the
    120 linear layers and the LM head) runs that activation precision on the same blocks; unset,
    the default precision; a value that is none of them stops the load."""
    from infer.core.model.loader import load_model
    from infer.core.model.loader.default_model import ensure_default_model
    from infer_cpu import kernels
    from infer_cpu.quant.methods import DEFAULT_ACTIVATIONS

    if kernels.load() is None:
        pytest.skip(f"native kernels unavailable: {kernels.status().detail}")
    path = str(ensure_default_model(quiet=True))

    def precisions() -> collections.Counter:
        loaded = load_model(path, progress=False, skip_tokenizer_init=True)
        mods = [m for m in loaded.model.modules() if getattr(m, "quant_kind", None) == "native"]
        return collections.Counter([m.qweight.activations for m in mods]
                                   + [loaded.model.lm_head.qweight.activations])

    for value in ("int8", "int16", "float32"):
        monkeypatch.setenv("INFER_CPU_ACTIVATIONS", value)
        assert precisions() == {value: 121}
    monkeypatch.delenv("INFER_CPU_ACTIVATIONS")
    assert precisions() == {DEFAULT_ACTIVATIONS: 121}
    monkeypatch.setenv("INFER_CPU_ACTIVATIONS", "int4")
    with pytest.raises(ValueError, match="INFER_CPU_ACTIVATIONS='int4'"):
        load_model(path, progress=False, skip_tokenizer_init=True)


def test_gguf_file_under_auto_keeps_an_fp16_cache(monkeypatch):
    """A GGUF file under --dtype auto and --kv-cache-dtype auto: float32 activations over an fp16
    cache where the native attention reads it; --kv-cache-dtype bf16 is still bf16; an explicit
    --dtype float32 (with the GGUF blocks) keeps a float32 cache, as does the torch fallback
    (native kernels off)."""
    import torch
    from infer.core.model.loader import load_model
    from infer.core.model.loader.default_model import ensure_default_model
    from infer_cpu import kernels

    if kernels.load() is None:
        pytest.skip(f"native kernels unavailable: {kernels.status().detail}")
    path = str(ensure_default_model(quiet=True))

    def arch(**kw):
        loaded = load_model(path, progress=False, skip_tokenizer_init=True, **kw)
        return loaded.arch.dtype, loaded.arch.kv_dtype, loaded.ctx.quantization

    assert arch() == (torch.float32, torch.float16, "gguf")
    assert arch(kv_cache_dtype="bf16") == (torch.float32, torch.bfloat16, "gguf")
    assert arch(dtype="float32", quantization="gguf") == (torch.float32, torch.float32, "gguf")
    monkeypatch.setattr(kernels, "_state", {"lib": None, "detail": "off for this test"})
    assert arch() == (torch.float32, torch.float32, "gguf")
