"""Pipeline parallelism (``--pp-size``): the decoder layers split into consecutive stages.

Rank r of a tp x pp engine is stage ``r // tp``, tensor-parallel rank ``r % tp``. Stage s holds
layers ``[lo, hi)`` (an even split, earlier stages taking the remainder) and only their weights
and KV cache; every stage keeps the embedding, final norm and LM head (tied heads need the
embedding anyway; untying them per stage is left for models where it matters).

One step: stage 0 embeds the tokens, runs its layers and sends the hidden states [T, hidden] to
the same tensor-parallel rank of stage 1 (``torch.distributed.send``), which runs its layers and
passes them on; the last stage computes the logits and sends them back to stage 0, whose tp rank
0 is the engine's rank 0 and samples. Stages run one after another (no micro-batching yet): pp
splits a model that does not fit one device, it does not speed up one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Layers of stage ``pp_rank``: an even split, the first stages taking one more."""
    if num_layers < pp_size:
        from infer.core.config.flags import ConfigError

        raise ConfigError(f"--pp-size {pp_size}: the model has only {num_layers} layers; use at "
                          f"most {num_layers} stages")
    base, extra = divmod(num_layers, pp_size)
    lo = pp_rank * base + min(pp_rank, extra)
    return range(lo, lo + base + (1 if pp_rank < extra else 0))


@dataclass(frozen=True)
class PipelineStage:
    pp_rank: int
    pp_size: int
    tp_size: int
    tp_rank: int
    layers: range

    @property
    def is_first(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def _global(self, pp_rank: int) -> int:
        return pp_rank * self.tp_size + self.tp_rank

    def forward(self, model: Any, fwd: Any) -> torch.Tensor | None:
        """This stage's part of the model on ``fwd``: logits [N, vocab] on stage 0 (and the last
        stage), None on a stage in between."""
        t = fwd.input_ids.shape[0]
        if self.is_first:
            h = model.model.embed_tokens(fwd.input_ids)  # [T, hidden]
        else:
            h = torch.empty((t, model.hidden_size), dtype=model.ctx.dtype, device=fwd.input_ids.device)
            dist.recv(h, src=self._global(self.pp_rank - 1))
        for i in self.layers:
            h = model.model.layers[i](fwd.positions, h, fwd)
        if not self.is_last:
            dist.send(h.contiguous(), dst=self._global(self.pp_rank + 1))
            if not self.is_first:
                return None
            logits = torch.empty((fwd.logits_indices.shape[0], model.config.vocab_size),
                                 dtype=torch.float32, device=h.device)
            dist.recv(logits, src=self._global(self.pp_size - 1))
            return logits
        logits = model.compute_logits(h, fwd)
        dist.send(logits.contiguous(), dst=self._global(0))
        return logits


class MissingLayer(torch.nn.Module):
    """The place of a layer that another pipeline stage holds (no weights, never called)."""

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("this layer belongs to another pipeline stage")
