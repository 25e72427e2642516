"""Linear (GEMM) method interface. A method owns how a layer's weights are stored and applied.

Lifecycle: ``create_weights`` (parameters on the layer, meta or real device) → the loader fills
them → ``process_weights_after_loading`` (repack, quantize) → ``apply`` per forward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LinearConfig:
    quantization: str | None  # --quantization value, None for unquantized
    dtype: torch.dtype  # activation / unquantized weight dtype
    device: torch.device
    # --enable-deterministic-inference: every row's result independent of the batch (its size,
    # the other rows, chunking); a method that cannot give that refuses the layer at load
    deterministic: bool = False
    # the checkpoint's directory, for a method that reads the checkpoint's own description of
    # its quantized tensors (Ascend's modelslim: quant_model_description.json); None: unknown
    checkpoint_dir: str | None = None


class LinearMethod(ABC):
    def __init__(self, config: LinearConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       bias: bool) -> None:
        """Default: a dense ``weight`` [out, in] (and ``bias`` [out]) in config.dtype."""
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=self.config.dtype,
                                                device=self.config.device), requires_grad=False)
        layer.bias = (nn.Parameter(torch.empty(out_features, dtype=self.config.dtype,
                                               device=self.config.device), requires_grad=False)
                      if bias else None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027 (optional hook)
        """Called once after all weights are loaded."""

    def bind_model(self, model: nn.Module) -> None:  # noqa: B027 (optional hook)
        """Called once with the built model before its weights load: a method whose weights
        differ per layer (a pre-quantized checkpoint naming each layer's scheme) replaces the
        parameters ``create_weights`` made, by the layers' module names."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
