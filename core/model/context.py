"""ModelContext: the platform implementations one model is built with, resolved once.

Built from keyword settings (the loader passes its LoadConfig view's) plus the active
``Platform`` and the ``PluginHost``:

- ``attention_factory``: ``host.registries.attention[attention_backend]`` for this platform
  (default ``platform.default_attention_backend``). ``create_attention_backend(AttentionConfig)``
  makes the one backend object shared by every attention layer of the model; the model runner
  calls ``ctx.attn_backend.plan(meta)`` once per batch.
- ``linear_method``: from ``host.registries.linear`` keyed by quantization (``None`` = dense).
  For a GGUF load with no explicit ``--dtype`` and no ``--quantization`` the ``"gguf"`` method is
  used when a plugin registers one for this platform; its layers carry ``gguf_qtype`` and
  ``gguf_raw`` (see ``infer.core.model.layers.linear``). ``dense_linear_method`` is always the
  unquantized method (router gates, LM head).
- ``moe_runner``: ``host.registries.moe[moe_runner_backend]`` (default ``"auto"``).
- ``comm``: the communicator for ``platform.dist_backend`` over the ``tp_size`` ranks of the
  tensor-parallel group (``comm_group``: a torch.distributed group, None for the default group,
  which the caller initialises with ``platform.dist_backend`` before building a context with
  tp_size > 1). ``tp_rank`` picks this rank's shard and ``ep_size`` the expert-parallel split
  (``infer.core.model.layers.shard``).
- ``ops``: per-layer ops (``infer.core.ops.layer_ops``): the platform's fused kernels where a
  plugin registers them through ``register_layer_ops``, else the torch references.

An unknown or unavailable name raises ``ModelContextError`` listing what this platform offers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from infer.core.ops.attention import AttentionBackend, AttentionConfig
from infer.core.ops.comm import Communicator
from infer.core.ops.layer_ops import OPS, REFERENCE_OPS, LayerOps
from infer.core.ops.linear import LinearConfig, LinearMethod
from infer.core.ops.moe import MoERunner
from infer.core.platform import Platform
from infer.core.plugins import PluginHost, Registries


class ModelContextError(ValueError):
    """A setting names an implementation this platform does not provide."""


def _pick(table: dict, key: Any, platform: Platform, what: str, flag: str) -> Any:
    factory = Registries.pick(table, key, platform.name)
    if factory is None:
        names = [str(n) for n in Registries.names_for(table, platform.name)]
        raise ModelContextError(
            f"{flag} {key}: no {what} of that name is available on platform '{platform.name}' "
            f"(available: {', '.join(names) or 'none'})")
    return factory


@dataclass
class ModelContext:
    platform: Platform
    host: PluginHost
    dtype: torch.dtype
    device: torch.device
    attention_backend_name: str
    attention_factory: Any
    quantization: str | None  # the linear-method key actually used ("gguf" for raw GGUF)
    linear_method: LinearMethod
    dense_linear_method: LinearMethod
    moe_runner_name: str
    moe_runner: MoERunner
    comm: Communicator
    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1  # expert-parallel groups inside the tp ranks (divides tp_size)
    pipeline: Any = None  # this rank's PipelineStage under --pp-size > 1 (infer.core.model.pipeline)
    context_length: int | None = None  # longest sequence; sizes the rotary table
    deterministic: bool = False  # --enable-deterministic-inference (batch-invariant kernels)
    attn_backend: AttentionBackend | None = field(default=None)
    ops: LayerOps = REFERENCE_OPS  # RMSNorm / rotary / SiLU gate (platform kernels or torch)

    @classmethod
    def build(cls, *, platform: Platform, host: PluginHost, dtype: torch.dtype,
              attention_backend: str | None = None, moe_runner_backend: str | None = "auto",
              quantization: str | None = None, load_format: str = "auto",
              dtype_explicit: bool = False, tp_size: int = 1, tp_rank: int = 0,
              ep_size: int = 1, comm_group: Any = None,
              deterministic: bool = False, checkpoint_dir: str | None = None) -> ModelContext:
        """Resolve every implementation; raises ModelContextError for an unavailable name."""
        if not 0 <= tp_rank < tp_size or tp_size % ep_size:
            raise ModelContextError(f"tp_rank {tp_rank} / tp_size {tp_size} / ep_size {ep_size}: "
                                    "need 0 <= tp_rank < tp_size and ep_size dividing tp_size")
        reg = host.registries
        device = torch.device(platform.torch_device)
        attn_name = attention_backend or platform.default_attention_backend
        attn_factory = _pick(reg.attention, attn_name, platform, "attention backend",
                             "--attention-backend")
        quant_key = quantization
        if (quantization is None and load_format == "gguf" and not dtype_explicit
                and Registries.pick(reg.linear, "gguf", platform.name) is not None):
            quant_key = "gguf"
        lin_cfg = LinearConfig(quantization=quant_key, dtype=dtype, device=device,
                               deterministic=deterministic, checkpoint_dir=checkpoint_dir)
        linear = _pick(reg.linear, quant_key, platform, "linear method", "--quantization")(lin_cfg)
        dense = (linear if quant_key is None else
                 _pick(reg.linear, None, platform, "linear method", "--quantization")(
                     LinearConfig(quantization=None, dtype=dtype, device=device,
                                  deterministic=deterministic)))
        moe_name = moe_runner_backend or "auto"
        moe = _pick(reg.moe, moe_name, platform, "MoE runner", "--moe-runner-backend")()
        comm_factory = _pick(reg.communicators, platform.dist_backend, platform, "communicator",
                             "communicator")
        comm = (comm_factory(tp_size, tp_rank) if comm_group is None
                else comm_factory(tp_size, tp_rank, group=comm_group))
        return cls(platform=platform, host=host, dtype=dtype, device=device,
                   attention_backend_name=attn_name, attention_factory=attn_factory,
                   quantization=quant_key, linear_method=linear, dense_linear_method=dense,
                   moe_runner_name=moe_name, moe_runner=moe, comm=comm,
                   tp_size=tp_size, tp_rank=tp_rank, ep_size=ep_size, deterministic=deterministic,
                   ops=LayerOps.with_kernels({name: Registries.pick(reg.layer_ops, name, platform.name)
                                              for name in OPS}))

    def create_attention_backend(self, config: AttentionConfig) -> AttentionBackend:
        """Create the model's one attention backend (stored as ``attn_backend``)."""
        self.attn_backend = self.attention_factory(config)
        return self.attn_backend
