"""Decode graph-capture interface (CUDA graphs, ACL graphs, HPU graphs)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class GraphRunner(ABC):
    """Captures decode steps for a set of batch sizes and replays them.

    ``can_run(batch)`` says whether a captured graph covers this batch (decode-only and not larger
    than the largest captured size); ``run(batch)`` pads to the next captured size, updates the
    static inputs and attention metadata in place, replays and returns logits for the real rows.
    """

    @abstractmethod
    def capture(self) -> None: ...

    @abstractmethod
    def can_run(self, batch: Any) -> bool: ...

    @abstractmethod
    def run(self, batch: Any) -> Any: ...
