"""The core's own plugin: registers the built-in model architectures through the same
``register_models`` hook a third-party plugin uses, and the plain-torch reference ops that every
platform may run (``infer.core.ops.reference``, whose hooks are re-exported here)."""

from __future__ import annotations

from typing import Any

from infer.core.hookspecs import hookimpl
from infer.core.ops.reference import (  # noqa: F401 (the core plugin's op hooks)
    register_attention_backends,
    register_communicators,
    register_linear_methods,
    register_moe_runners,
)
from infer.core.plugins import load_target

INFER_API_VERSION = 1

BUILTIN_MODELS = {
    # architecture name -> "module:class", imported lazily when the model is built
    "LlamaForCausalLM": "infer.core.model.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "infer.core.model.models.llama:MistralForCausalLM",
    "Qwen2ForCausalLM": "infer.core.model.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "infer.core.model.models.qwen3:Qwen3ForCausalLM",
    "MixtralForCausalLM": "infer.core.model.models.mixtral:MixtralForCausalLM",
    "Qwen3MoeForCausalLM": "infer.core.model.models.qwen3_moe:Qwen3MoeForCausalLM",
}


@hookimpl
def register_models(register: Any) -> None:
    for arch, target in BUILTIN_MODELS.items():
        register(arch, target)


class UnknownArchitectureError(ValueError):
    """The checkpoint's architecture has no registered model class."""


def resolve_model_class(models: dict[str, Any], architecture: str) -> type:
    """The class registered for ``architecture`` ("module:Class" strings are imported here)."""
    target = models.get(architecture)
    if target is None:
        raise UnknownArchitectureError(
            f"model architecture {architecture!r} is not supported (supported: "
            f"{', '.join(sorted(models)) or 'none'}); a plugin can add it through register_models")
    return load_target(target)
