"""DecoderOnlyLM: the shared skeleton of the decoder-only models (Hugging Face module names).

    model.embed_tokens -> model.layers[i] (attention + MLP/MoE, pre-norm residuals) -> model.norm
    -> lm_head, evaluated only at ``fwd.logits_indices``.

A model file subclasses it and supplies ``make_layer``. ``load_weights`` takes checkpoint
(name, tensor) pairs with Hugging Face names, fuses q/k/v and gate/up into their merged layers and
stacks per-expert MoE weights; a tensor with no place in the model, or a parameter that nothing
filled, is an error. Checkpoint tensors may be lazy (``loader.weights.CheckpointTensor``): each
layer reads only the slice its tensor-parallel rank holds (``layers.shard``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from infer.core.model.arch import config_context_length, rope_parameters
from infer.core.model.layers.embedding import LMHead, VocabEmbedding
from infer.core.model.layers.linear import LinearBase
from infer.core.model.layers.moe import SparseMoE
from infer.core.model.layers.norm import RMSNorm
from infer.core.model.layers.rotary import RotaryEmbedding
from infer.core.model.loader.weights import materialize
from infer.core.model.pipeline import MissingLayer
from infer.core.ops.forward_batch import ForwardBatch
from torch import nn

# checkpoint sub-name -> (fused module sub-name, shard id)
STACKED = {".q_proj.": (".qkv_proj.", "q"), ".k_proj.": (".qkv_proj.", "k"),
           ".v_proj.": (".qkv_proj.", "v"), ".gate_proj.": (".gate_up_proj.", 0),
           ".up_proj.": (".gate_up_proj.", 1)}
EXPERT = re.compile(r"(.+)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
EXPERT_STACKED = re.compile(r"(.+)\.experts\.(gate_up_proj|down_proj)$")
EXPERT_PART = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up",
               "down_proj": "down"}


LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DecoderOnlyLM(nn.Module):
    def __init__(self, config: Any, ctx: Any) -> None:
        super().__init__()
        self.config, self.ctx = config, ctx
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        max_pos = max(config_context_length(config), getattr(ctx, "context_length", None) or 0)
        self.rotary = RotaryEmbedding(self.head_dim, max_pos, rope_parameters(config), ops=ctx.ops)
        self.model = nn.Module()
        self.model.embed_tokens = VocabEmbedding(config.vocab_size, self.hidden_size, ctx)
        self.pipeline = getattr(ctx, "pipeline", None)  # this rank's stage (--pp-size > 1)
        self.model.layers = nn.ModuleList(
            [self.make_layer(config, ctx, i) if self._owns(i) else MissingLayer()
             for i in range(config.num_hidden_layers)])
        self.model.norm = RMSNorm(self.hidden_size, config.rms_norm_eps, ctx.dtype, ctx.ops)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = LMHead(config.vocab_size, self.hidden_size, ctx,
                              tie_to=self.model.embed_tokens if tied else None)

    def make_layer(self, config: Any, ctx: Any, layer_id: int) -> nn.Module:
        raise NotImplementedError

    def _owns(self, layer_id: int) -> bool:
        return self.pipeline is None or layer_id in self.pipeline.layers

    def forward(self, fwd: ForwardBatch) -> torch.Tensor:
        """Packed tokens of the batch -> float32 logits [N, vocab] at ``fwd.logits_indices``
        (under pipeline parallelism: this stage's part, see infer.core.model.pipeline)."""
        if self.pipeline is not None:
            return self.pipeline.forward(self, fwd)
        h = self.model.embed_tokens(fwd.input_ids)  # [T, hidden]
        for layer in self.model.layers:
            h = layer(fwd.positions, h, fwd)
        return self.compute_logits(h, fwd)

    def compute_logits(self, h: torch.Tensor, fwd: ForwardBatch) -> torch.Tensor:
        """Hidden states after the last layer [T, hidden] -> float32 logits [N, vocab] at
        ``fwd.logits_indices`` (final norm, LM head). Graph runners that replace the layers call
        this for the tail of the step."""
        h = self.model.norm(h.index_select(0, fwd.logits_indices))  # [N, hidden]
        return self.lm_head(h)  # [N, vocab] float32

    # -- weights -------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.lm_head.tied):
                continue
            if (m := LAYER.match(name)) and not self._owns(int(m[1])):
                continue  # another pipeline stage's layer
            if (m := EXPERT.match(name)) and isinstance(modules.get(m[1]), SparseMoE):
                modules[m[1]].load_expert(int(m[2]), EXPERT_PART[m[3]], tensor)
                loaded.add(f"{m[1]}.{'w2' if EXPERT_PART[m[3]] == 'down' else 'w13'}")
                continue
            if (m := EXPERT_STACKED.match(name)) and isinstance(modules.get(m[1]), SparseMoE):
                which = "gate_up" if m[2] == "gate_up_proj" else "down_all"
                modules[m[1]].load_expert(0, which, tensor)
                loaded.add(f"{m[1]}.{'w13' if which == 'gate_up' else 'w2'}")
                continue
            shard = None
            for part, (fused, shard_id) in STACKED.items():
                if part in name and name.replace(part, fused).rsplit(".", 1)[0] in modules:
                    name, shard = name.replace(part, fused), shard_id
                    break
            mod_name, param = name.rsplit(".", 1)
            mod = modules.get(mod_name)
            if mod is None or not hasattr(mod, param):
                raise KeyError(f"checkpoint tensor {name!r} has no place in "
                               f"{type(self).__name__}")
            if isinstance(mod, (LinearBase, VocabEmbedding, LMHead)):
                mod.load(param, tensor, shard)  # this rank's slice only
            else:
                dest = getattr(mod, param)
                if dest.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, model "
                                     f"{tuple(dest.shape)}")
                dest.data.copy_(materialize(tensor))
            loaded.add(name)
        missing = [n for n, _ in self.named_parameters() if n not in loaded]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")

    def finish_loading(self) -> None:
        """Hand every linear layer to its method's post-load step (repacking, quantization)."""
        for mod in self.modules():
            if isinstance(mod, LinearBase):
                mod.finish_loading()
        process_lm_head = getattr(self.ctx.linear_method, "process_lm_head", None)
        if process_lm_head is not None:  # optional hook of a quantized method
            process_lm_head(self.lm_head)

    def init_dummy_weights(self, seed: int = 0) -> None:
        """Random weights (``--load-format dummy``): small uniform values, norms at 1."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.data.fill_(1.0)
            else:
                p.data.copy_(torch.empty(p.shape).uniform_(-0.02, 0.02, generator=gen))
