"""Deliberately broken ops, each with one realistic bug, that the conformance kit must reject.

Module level (not inside a test) so that the kit's two-rank communicator check can import them in
its spawned processes (``"broken_ops:Name"`` with this folder on sys.path)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from infer.core.ops.attention import AttentionMetadata, write_kv
from infer.core.ops.comm import ProcessGroupCommunicator
from infer.core.ops.layer_ops import rms_norm_ref, rotary_ref
from infer.core.ops.linear import LinearMethod
from infer.core.ops.reference.attention import TorchNativeAttention
from infer.core.ops.reference.linear import DenseLinearMethod
from infer.core.ops.reference.moe import TorchMoERunner


class IgnoresPrefix(TorchNativeAttention):
    """Attends over the new tokens only, as if nothing were cached (right for prefill only)."""

    def forward(self, q, k, v, k_cache, v_cache, layer_id):
        meta = self.meta
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        qsl = meta.query_start_loc.tolist()
        for a, b in zip(qsl[:-1], qsl[1:], strict=True):
            out[a:b] = F.scaled_dot_product_attention(
                q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1),
                is_causal=True, scale=self.config.scale, enable_gqa=True).transpose(0, 1)
        return out


class ForgetsKV(TorchNativeAttention):
    """Right outputs, but the new k/v never reach the cache (the next step would miss them)."""

    def forward(self, q, k, v, k_cache, v_cache, layer_id):
        return super().forward(q, k, v, k_cache.clone(), v_cache.clone(), layer_id)


class ReadsOneSlotTooMany(TorchNativeAttention):
    """Each sequence also attends to the slot just past its end (a padding slot)."""

    def plan(self, meta: AttentionMetadata) -> None:
        super().plan(meta)
        for i, p in enumerate(self._plans):
            ext = p.end - p.start
            p.seq_len += 1
            p.pages = meta.block_tables[i, :-(-p.seq_len // meta.page_size)].long()
            if p.mask is None and p.causal:
                prefix = p.seq_len - 1 - ext
                p.mask = torch.arange(p.seq_len - 1)[None, :] <= torch.arange(prefix, prefix + ext)[:, None]
                p.causal = False
            if p.mask is not None:
                p.mask = torch.cat([p.mask, torch.ones_like(p.mask[:, :1])], dim=1)
        self._decode_mask = None  # every row through the per-sequence path


class PlansOnce(TorchNativeAttention):
    """Keeps the first batch's plan for every later batch (stale per-batch state)."""

    def plan(self, meta: AttentionMetadata) -> None:
        if self.meta is None:
            super().plan(meta)


class RefusesEverything(TorchNativeAttention):
    def __init__(self, config):
        raise NotImplementedError("this backend takes no configuration at all")


class RefusesPageSizeOne(TorchNativeAttention):
    def __init__(self, config):
        if config.page_size == 1:
            raise ValueError("page size 1 is not supported; use 16")
        super().__init__(config)


class DropsBias(DenseLinearMethod):
    def apply(self, layer, x):
        return F.linear(x, layer.weight)


class CoarseInt2(LinearMethod):
    """A 'quantization' to 4 levels per row: far outside the kit's quantized bound."""

    def process_weights_after_loading(self, layer):
        w = layer.weight.data.float()
        scale = w.abs().amax(dim=1, keepdim=True) / 1.5
        layer.weight.data.copy_(((w / scale).round().clamp(-2, 1) * scale).to(w.dtype))

    def apply(self, layer, x):
        return F.linear(x, layer.weight, layer.bias)


class IgnoresRoutingWeights(TorchMoERunner):
    def apply(self, hidden, w13, w2, topk_weights, topk_ids):
        return super().apply(hidden, w13, w2, torch.ones_like(topk_weights), topk_ids)


def rms_norm_without_residual(x, weight, eps, residual=None):
    """Norms x alone and hands the old residual back: the residual add is lost."""
    out, _ = rms_norm_ref(x, weight, eps, None)
    return out, residual


def rotary_wrong_half(positions, q, k, cos_sin, rotary_dim):
    """Swaps cos and sin (a table read the wrong way round)."""
    half = cos_sin.shape[1] // 2
    swapped = torch.cat([cos_sin[:, half:], cos_sin[:, :half]], dim=-1)
    return rotary_ref(positions, q, k, swapped, rotary_dim)


def silu_on_the_wrong_half(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(up) * gate


class SkipsAllReduce(ProcessGroupCommunicator):
    """Returns its own tensor: right with one rank, wrong with two."""

    def all_reduce(self, x):
        return x


class GathersInReverse(ProcessGroupCommunicator):
    def all_gather(self, x, dim=-1):
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts[::-1], dim=dim)


class ReplaysAtPositionZero:
    """A 'graph runner' whose replay loses the positions (as a static buffer never updated)."""

    def __init__(self, model_runner, graph_config):
        self.mr = model_runner

    def capture(self):
        pass

    def can_run(self, batch):
        return batch.attn.is_decode_only

    def run(self, batch):
        batch.positions.zero_()
        self.mr.attn_backend.plan(batch.attn)
        return self.mr.model(batch)


class ReplaysEagerly(ReplaysAtPositionZero):
    """Correct (it runs the eager forward): the graph check must pass it."""

    def run(self, batch):
        self.mr.attn_backend.plan(batch.attn)
        return self.mr.model(batch)


class PadsIntoScratch(ReplaysEagerly):
    """Correct: like a padded replay, it also writes keys/values into the scratch page 0."""

    page = 0

    def run(self, batch):
        out = super().run(batch)
        for cache in (*self.mr.kv_cache.k, *self.mr.kv_cache.v):
            cache[self.page, 0].add_(1.0)  # one slot of every layer, as a padding row would
        return out


class WritesOutsideTheBatch(PadsIntoScratch):
    """Writes a slot of page 1, which no row of the batch owns: the graph check must fail it."""

    page = 1


class DeclinesEverything(ReplaysEagerly):
    reason = "captured nothing"

    def can_run(self, batch):
        return False


class RefusesFp8Cache(TorchNativeAttention):
    def __init__(self, config):
        if config.kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError("this backend refuses an fp8 cache")
        super().__init__(config)

