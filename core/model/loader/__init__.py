"""load_model: checkpoint -> LoadedModel (model graph with weights, shapes, context, tokenizer).

Weights are read one tensor at a time from memory-mapped files (safetensors, torch mmap) or the
GGUF reader into parameters allocated once with ``torch.empty`` on the platform device, so no
second full copy of the model exists at any time. A tqdm bar shows progress.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from infer.core.model.arch import ModelArch
from infer.core.model.context import ModelContext
from infer.core.model.layers.shard import check_model_split, kv_head_slice
from infer.core.model.loader.dtype import resolve_dtype, resolve_kv_dtype
from infer.core.model.loader.model_config import context_length_for, load_tokenizer, read_config
from infer.core.model.loader.source import ModelSource, ModelSourceError, resolve_source
from infer.core.model.registry import UnknownArchitectureError, resolve_model_class
from infer.core.ops.attention import AttentionConfig
from infer.core.plugins import Registries
from torch import nn

log = logging.getLogger(__name__)

MODEL_IMPLS = ("auto", "infer", "sglang", "transformers")
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "max_new_tokens")

__all__ = ["LoadedModel", "ModelSourceError", "UnknownArchitectureError", "load_model",
           "load_model_from_args", "load_model_from_config"]


@dataclass
class LoadedModel:
    """``model.forward(fwd: ForwardBatch) -> float32 logits [N, vocab]`` at ``fwd.logits_indices``,
    reading layer i's cache from ``fwd.kv_cache.k[i] / v[i]``; the runner calls
    ``ctx.attn_backend.plan(fwd.attn)`` once per batch before it."""

    model: nn.Module
    arch: ModelArch
    ctx: ModelContext
    tokenizer: Any  # transformers tokenizer, None with skip_tokenizer_init
    hf_config: Any
    source: ModelSource
    generation_config: dict[str, Any] = field(default_factory=dict)  # sampling defaults
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None


def _architecture(config: Any) -> str:
    archs = getattr(config, "architectures", None)
    if archs:
        return archs[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, config.model_type)


def _generation_config(source: ModelSource) -> dict[str, Any]:
    path = source.directory / "generation_config.json"
    if source.load_format == "gguf" or not path.is_file():
        return {}
    return json.loads(path.read_text())


def _eos_ids(gen: dict[str, Any], config: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for value in (gen.get("eos_token_id"), getattr(config, "eos_token_id", None),
                  getattr(tokenizer, "eos_token_id", None)):
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    return ids


def load_model(model_path: str, *, platform: Any = None, host: Any = None, dtype: str = "auto",
               load_format: str = "auto", revision: str | None = None,
               quantization: str | None = None, tokenizer_path: str | None = None,
               context_length: int | None = None, model_impl: str = "auto",
               trust_remote_code: bool = False, attention_backend: str | None = None,
               moe_runner_backend: str | None = "auto", page_size: int = 1,
               max_batch_size: int = 256, dtype_explicit: bool = False,
               skip_tokenizer_init: bool = False, progress: bool = True,
               seed: int = 0, torchao_config: str = "", kv_cache_dtype: str = "auto",
               quantization_param_path: str | None = None, tp_size: int = 1, tp_rank: int = 0,
               ep_size: int = 1, comm_group: Any = None, pp_size: int = 1, pp_rank: int = 0,
               enable_deterministic_inference: bool = False) -> LoadedModel:
    """Build the model for ``model_path`` on the active platform. Settings carry the SGLang
    server-argument meanings; errors name the bad value and what to use instead. With
    ``tp_size`` > 1 this builds and loads rank ``tp_rank``'s shard only (its process group
    initialised by the caller; ``infer.core.model.layers.shard``). With ``pp_size`` > 1 only
    stage ``pp_rank``'s layers are built and loaded (``infer.core.model.pipeline``)."""
    if host is None:
        from infer.core.plugins import get_plugin_host

        host = get_plugin_host()
    platform = platform or host.select()
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"--model-impl {model_impl!r} is not one of {', '.join(MODEL_IMPLS)}")
    if model_impl == "transformers":
        raise NotImplementedError("--model-impl transformers is not implemented: infer runs only "
                                  "its own model implementations (use auto)")
    source = resolve_source(model_path, load_format, revision)
    is_gguf = source.load_format == "gguf"
    if torchao_config:
        # weight-only schemes of SGLang's --torchao-config, served by the platform's linear
        # method registered under "torchao:<value>" (no torchao import)
        if quantization is not None:
            raise ValueError("--torchao-config and --quantization cannot be combined")
        quantization = f"torchao:{torchao_config}"
        offered = [str(k)[len("torchao:"):] for k in Registries.names_for(host.registries.linear, platform.name)
                   if str(k).startswith("torchao:")]
        if torchao_config not in offered:
            raise NotImplementedError(f"--torchao-config {torchao_config} is not implemented on "
                                      f"{platform.name} (available: {', '.join(offered) or 'none'})")
    elif quantization is not None:
        _check_quantization(quantization, is_gguf)
    if quantization_param_path:
        raise NotImplementedError(
            f"--quantization-param-path {quantization_param_path}: loading KV-cache scales from a "
            f"file is not implemented; without it an fp8 KV cache uses scales of 1.0")
    gguf_ckpt = None
    if is_gguf:
        from infer.core.model.loader.gguf_reader import GGUFCheckpoint

        gguf_ckpt = GGUFCheckpoint(source.gguf_file)
    config = read_config(source, trust_remote_code)
    prequant = getattr(config, "quantization_config", None)
    if quantization is not None and not is_gguf and prequant:
        method = prequant.get("quant_method", "?") if isinstance(prequant, dict) else "?"
        raise NotImplementedError(f"--quantization {quantization}: {model_path} is already quantized "
                                  f"(quant_method {method}); loading pre-quantized checkpoints is not "
                                  f"implemented, only quantizing an fp16/bf16/fp32 checkpoint")
    architecture = _architecture(config)
    model_cls = resolve_model_class(host.registries.models, architecture)
    torch_dtype = resolve_dtype(dtype, config, is_gguf=is_gguf)
    length = context_length_for(config, context_length)
    kv_dtype = resolve_kv_dtype(kv_cache_dtype, torch_dtype)
    if is_gguf and kv_cache_dtype == "auto" and dtype == "auto" and not dtype_explicit:
        kv_dtype = platform.gguf_kv_dtype(torch_dtype)
        if kv_dtype != torch_dtype:
            name = str(torch_dtype).removeprefix("torch.")
            log.info("KV cache %s: platform %s's cache for a GGUF file under --dtype auto (its "
                     "activations stay %s; --dtype %s --quantization gguf keeps a %s cache)",
                     str(kv_dtype).removeprefix("torch."), platform.name, name, name, name)
    arch = ModelArch.from_hf_config(config, dtype=torch_dtype, context_length=length,
                                    kv_dtype=kv_dtype)
    arch = ModelArch(**{**arch.__dict__, "architecture": architecture})
    check_model_split(config, tp_size, ep_size)  # ConfigError before any weight is read

    ctx = ModelContext.build(tp_size=tp_size, tp_rank=tp_rank, ep_size=ep_size,
                             comm_group=comm_group,
                             platform=platform, host=host, dtype=torch_dtype,
                             attention_backend=attention_backend,
                             moe_runner_backend=moe_runner_backend, quantization=quantization,
                             load_format=source.load_format,
                             dtype_explicit=dtype_explicit or dtype != "auto",
                             deterministic=enable_deterministic_inference,
                             checkpoint_dir=str(source.directory))
    if pp_size > 1:
        from infer.core.model.pipeline import PipelineStage, stage_layers

        ctx.pipeline = PipelineStage(pp_rank, pp_size, tp_size, tp_rank,
                                     stage_layers(arch.num_layers, pp_size, pp_rank))
    ctx.context_length = length
    ctx.create_attention_backend(AttentionConfig(
        num_heads=arch.num_heads // ctx.tp_size, num_kv_heads=kv_head_slice(arch.num_kv_heads, tp_size, tp_rank).size,
        head_dim=arch.head_dim, scale=arch.head_dim ** -0.5, page_size=page_size,
        dtype=torch_dtype, kv_dtype=arch.kv_dtype, device=ctx.device,
        num_layers=arch.num_layers, max_batch_size=max_batch_size, max_context_len=length,
        deterministic=enable_deterministic_inference))

    with torch.device(ctx.device):
        model = model_cls(config, ctx)
    ctx.linear_method.bind_model(model)  # a per-layer scheme (modelslim) replaces parameters
    if source.load_format == "dummy":
        model.init_dummy_weights(seed)
    elif is_gguf:
        model.load_weights(gguf_ckpt.tensors(config, progress))
    elif source.load_format == "safetensors":
        from infer.core.model.loader.weights import iter_safetensors

        model.load_weights(iter_safetensors(source.weight_files, progress))
    else:
        from infer.core.model.loader.weights import iter_pt

        model.load_weights(iter_pt(source.weight_files, progress))
    model.finish_loading()
    model.eval()

    tokenizer = None
    if not skip_tokenizer_init:
        tokenizer = load_tokenizer(source, tokenizer_path, trust_remote_code, revision, arch.vocab_size)
    gen = _generation_config(source)
    template = getattr(tokenizer, "chat_template", None) or (
        gguf_ckpt.chat_template if gguf_ckpt else None)
    return LoadedModel(model=model, arch=arch, ctx=ctx, tokenizer=tokenizer, hf_config=config,
                       source=source, chat_template=template,
                       generation_config={k: gen[k] for k in _SAMPLING_KEYS if k in gen},
                       eos_token_ids=_eos_ids(gen, config, tokenizer))


def _check_quantization(quantization: str, is_gguf: bool) -> None:
    """Refuse --quantization values the loader cannot serve; every other value is looked up in
    the platform's linear methods by ``ModelContext`` (an unknown one lists what is available)."""
    if quantization == "gguf" and not is_gguf:
        raise NotImplementedError("--quantization gguf needs a GGUF file (it serves the file's "
                                  "quantized blocks)")
    if quantization.startswith("torchao:"):
        raise ValueError(f"--quantization {quantization}: torchao schemes are chosen with "
                         f"--torchao-config, not --quantization")
    if is_gguf and quantization != "gguf":
        raise NotImplementedError(f"--quantization {quantization} quantizes an fp16/bf16 checkpoint "
                                  f"when it loads; a GGUF file is already quantized (use "
                                  f"--quantization gguf or none)")


def load_model_from_config(cfg: Any, *, platform: Any = None, host: Any = None) -> LoadedModel:
    """``load_model`` for a ``LoadConfig`` (infer.core.config.views)."""
    return load_model(cfg.model_path, platform=platform, host=host, **cfg.load_kwargs())


def load_model_from_args(args: Any, *, platform: Any = None, host: Any = None) -> LoadedModel:
    """``load_model`` for a ServerArgs (its ``LoadConfig`` view)."""
    from infer.core.config.views import LoadConfig

    return load_model_from_config(LoadConfig.from_server_args(args), platform=platform, host=host)
