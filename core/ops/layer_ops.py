"""Small per-layer ops a platform may replace with fused kernels: RMSNorm (with the residual add
of a pre-norm block), rotary embedding, the SiLU gate and the residual add after the MLP.

The functions here are the plain-torch references. A plugin contributes faster ones through the
``register_layer_ops`` hook: ``register(name, fn, platforms)`` with ``name`` one of ``OPS`` (``fn``
may be a ``"module:function"`` string, imported when a model is built). A contributed function
may return ``None`` for an input it does not handle (a dtype or layout its kernel was not written
for); the layer then runs the reference, so a plugin's op never has to cover every case to be
correct. ``ModelContext.build`` picks, per op, the platform's contribution (``Registries.pick``)
and ``LayerOps.with_kernels`` wraps it with that fallback.

Signatures (shapes in brackets):
- ``rms_norm(x [N, d], weight [d], eps, residual [N, d] | None) -> (out [N, d], x + residual | None)``:
  with ``residual`` the sum is normed and returned as the new residual stream.
- ``rotary(positions [T] int64, q [T, H, D], k [T, Hkv, D], cos_sin [P, R], R) -> (q, k)``:
  rotate-half over the first R dims; may rotate in place (q and k are fresh projections).
- ``silu_and_mul(x [T, 2I]) -> [T, I]``: silu(x[:, :I]) * x[:, I:].
- ``residual_add(h [T, d], x [T, d]) -> h + x``: the residual stream plus a block's output (the
  add a decoder layer ends with), in their dtype; a plugin's kernel must round as torch's add does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

OPS = ("rms_norm", "rotary", "silu_and_mul", "residual_add")


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x / sqrt(mean(x^2) + eps) * weight, reduced in float32, output in x's dtype."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype), (x if residual is not None else None)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, r: int) -> torch.Tensor:
    rot, rest = x[..., :r], x[..., r:]
    x1, x2 = rot.chunk(2, dim=-1)
    half = torch.cat([-x2, x1], dim=-1)
    out = rot * cos.to(x.dtype) + half * sin.to(x.dtype)
    return out if rest.numel() == 0 else torch.cat([out, rest], dim=-1)


def rotary_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
               rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin.index_select(0, positions).chunk(2, dim=-1)  # [T, r/2] each
    cos = torch.cat([cos, cos], dim=-1)[:, None, :]  # [T, 1, r]
    sin = torch.cat([sin, sin], dim=-1)[:, None, :]
    return _rotate(q, cos, sin, rotary_dim), _rotate(k, cos, sin, rotary_dim)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def residual_add_ref(h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return h + x


REFERENCE: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm_ref, "rotary": rotary_ref, "silu_and_mul": silu_and_mul_ref,
    "residual_add": residual_add_ref}


def _with_fallback(fast: Callable[..., Any], ref: Callable[..., Any]) -> Callable[..., Any]:
    def op(*args: Any) -> Any:
        out = fast(*args)
        return ref(*args) if out is None else out
    op.__name__ = getattr(fast, "__name__", "op")
    op.__wrapped__ = fast  # type: ignore[attr-defined]
    return op


@dataclass(frozen=True)
class LayerOps:
    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] = rms_norm_ref
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rotary_ref
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul_ref
    residual_add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual_add_ref

    @classmethod
    def with_kernels(cls, kernels: dict[str, Callable[..., Any] | None]) -> LayerOps:
        """Each op from ``kernels`` (falling back to the reference where it returns None), the
        reference where ``kernels`` has none."""
        return cls(**{name: _with_fallback(fn, REFERENCE[name])
                      for name, fn in kernels.items() if fn is not None})


REFERENCE_OPS = LayerOps()
