"""infer.core: the hardware-agnostic core (scheduler, KV-cache manager, model graph)."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:  # lazy: importing infer.core must stay cheap
    if name == "Engine":
        from infer.core.engine.engine import Engine

        return Engine
    raise AttributeError(name)
