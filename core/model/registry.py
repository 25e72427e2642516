"""The core's own plugin: registers the built-in model architectures through the same
``register_models`` hook a third-party plugin uses."""

from __future__ import annotations

from typing import Any

from infer.core.hookspecs import hookimpl

INFER_API_VERSION = 1

BUILTIN_MODELS = {
    # architecture name -> "module:class", imported lazily when the model is built
}


@hookimpl
def register_models(register: Any) -> None:
    for arch, target in BUILTIN_MODELS.items():
        register(arch, target)
