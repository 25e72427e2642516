"""``--quantization modelslim``: checkpoints written by msModelSlim, each linear layer run by the
scheme its description names.

The format (msModelSlim docs, "quantized_weight_format.md": docs/zh/feature_guide/
traditional_quantization_v0/ in MindStudio-ModelSlim; vllm-ascend's quantization/methods/
w8a8_static.py, w8a8_dynamic.py, w8a16.py and configs/modelslim_config.py read the same files):

* ``quant_model_description.json`` maps every tensor of the checkpoint to a type: ``FLOAT``
  (kept from the float model), ``W8A8`` (static activations), ``W8A8_DYNAMIC`` (per-token
  activations), ``W8A16`` (weight-only int8), plus keys such as ``model_quant_type``.
* A ``W8A8`` linear ``L`` has ``L.weight`` int8 [N, K], ``L.input_scale`` and ``L.input_offset``
  [1] (float16/bfloat16), ``L.deq_scale`` [N] (int64 holding float32 bits for float16 models,
  float32 for bfloat16 ones) and ``L.quant_bias`` int32 [N]; the computation is
  ``x_q = round(x / input_scale + input_offset)``, ``y = (x_q @ W^T + quant_bias) * deq_scale``
  (the float bias, and the input offset times the weight's row sums, are folded into
  quant_bias). Here: ``npu_quantize`` (multiplying by 1 / input_scale, as vllm-ascend and
  SGLang call it) and ``npu_quant_matmul`` with deq_scale (float32 for bfloat16 outputs, the
  ``npu_trans_quant_param`` int64 form for float16 ones, as the op's dtype table requires).
* ``W8A8_DYNAMIC`` and ``W8A16`` linears have ``weight`` int8 [N, K], ``weight_scale`` and
  ``weight_offset`` [N] or [N, 1] float32; the weight dequantises as
  ``(weight - weight_offset) * weight_scale``. W8A8_DYNAMIC runs ``npu_dynamic_quant`` +
  ``npu_quant_matmul`` (symmetric weights only: a non-zero offset is refused); W8A16 runs
  ``npu_weight_quant_batchmatmul``, whose ``(weight + antiquant_offset) * antiquant_scale`` takes
  the negated offset (the modelslim document says Ascend frameworks negate it when loading).

infer's merged layers (qkv_proj, gate_up_proj) take one scheme from their checkpoint parts, which
must agree. Per-tensor input scales stay per part: parts whose scales differ are quantized and
multiplied separately. A quantized tensor outside the dense linear layers (MoE experts, the LM
head, embeddings, a KV-cache scheme), a per-group scale, a float bias beside a W8A8 layer's
quant_bias, or the norm bias of msModelSlim's anti-outlier pass is refused at load, naming it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch_npu
from infer.core.model.layers.linear import LinearBase
from infer.core.model.loader.weights import materialize
from infer.core.model.models.base import STACKED
from infer.core.ops.linear import LinearMethod
from torch import nn

from infer_ascend.ops.linear import dynamic_w8a8, weight_only_int8

DESCRIPTION = "quant_model_description.json"
SCHEMES = ("FLOAT", "W8A8", "W8A8_DYNAMIC", "W8A16")
_PER_TENSOR = ("input_scale", "input_offset")
_PER_CHANNEL = ("weight_scale", "weight_offset", "deq_scale")
# fused module sub-name -> {shard id: checkpoint sub-name}
_PARTS: dict[str, dict[Any, str]] = {}
for _part, (_fused, _shard) in STACKED.items():
    _PARTS.setdefault(_fused.strip("."), {})[_shard] = _part.strip(".")


def find_description(checkpoint_dir: str | None) -> Path | None:
    """The checkpoint's quant_model_description.json, or None."""
    if checkpoint_dir is None:
        return None
    path = Path(checkpoint_dir) / DESCRIPTION
    return path if path.is_file() else None


def _float_from_int64(t: torch.Tensor) -> torch.Tensor:
    """modelslim's int64 deq_scale (float16 models): the float32 bits in the low 32 bits."""
    return (t & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


class ModelslimLinear(LinearMethod):
    """Every dense linear layer by the scheme the checkpoint's description gives it."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        path = find_description(config.checkpoint_dir)
        if path is None:
            raise ValueError(
                f"--quantization {config.quantization}: no {DESCRIPTION} in "
                f"{config.checkpoint_dir}; modelslim loads checkpoints written by msModelSlim "
                f"(for an fp16/bf16 checkpoint use --quantization w8a8_int8)")
        raw = json.loads(path.read_text())
        self.description = {k: v for k, v in raw.items() if isinstance(v, str)}
        kv = self.description.get("kv_cache_type")
        if kv not in (None, "FLOAT"):
            raise NotImplementedError(f"{path}: kv_cache_type {kv} (a quantized KV cache) is "
                                      f"not implemented on Ascend")

    # -- binding each layer to its scheme -------------------------------------------------------
    def _parts(self, name: str, layer: LinearBase) -> dict[Any, str]:
        """Shard id -> checkpoint prefix of the part it loads (one part for unmerged layers)."""
        head, _, last = name.rpartition(".")
        if set(layer.shards) == {None}:
            return {None: name}
        return {s: f"{head}.{_PARTS[last][s]}" for s in layer.shards}

    def bind_model(self, model: nn.Module) -> None:
        mine: set[str] = set()
        for name, layer in model.named_modules():
            if isinstance(layer, LinearBase) and layer.method is self:
                parts = self._parts(name, layer)
                mine.update(parts.values())
                self._bind(layer, name, parts)
        stray = [k for k, v in self.description.items()
                 if k.endswith(".weight") and v != "FLOAT" and k[:-len(".weight")] not in mine]
        smooth = [k for k in self.description if k.endswith("norm.bias") or ".module." in k]
        if smooth:
            raise NotImplementedError(
                f"modelslim: anti-outlier (smooth quant) norm parameters are not implemented on "
                f"Ascend (infer's RMSNorm has no bias): {smooth[:4]}")
        if stray:
            raise NotImplementedError(
                f"modelslim: quantized tensors outside the dense linear layers are not "
                f"implemented on Ascend (MoE experts, LM head, embeddings): {stray[:4]}")

    def _bind(self, layer: LinearBase, name: str, parts: dict[Any, str]) -> None:
        types = {p: self.description.get(f"{p}.weight") for p in parts.values()}
        if None in types.values():
            missing = [p for p, t in types.items() if t is None]
            raise KeyError(f"modelslim: {DESCRIPTION} does not describe {missing[0]}.weight")
        scheme = next(iter(types.values()))
        if len(set(types.values())) > 1:
            raise ValueError(f"modelslim: the parts of {name} are quantized differently "
                             f"({types}); infer runs a merged layer with one scheme")
        if scheme not in SCHEMES:
            raise NotImplementedError(f"modelslim: {name} is {scheme}; implemented on Ascend: "
                                      f"{', '.join(SCHEMES)}")
        layer.modelslim_scheme = scheme
        if scheme == "FLOAT":
            return
        n, k, dev = layer.out_features, layer.in_features, self.config.device
        has_bias = [f"{p}.bias" in self.description for p in parts.values()]
        if scheme == "W8A8" and any(has_bias):
            raise NotImplementedError(
                f"modelslim: {name} is W8A8 with a float bias beside quant_bias; modelslim's "
                f"W8A8 formula folds the bias into quant_bias, so this layout is refused")
        if layer.bias is not None and not any(has_bias):
            layer.bias = None  # folded into quant_bias (W8A8) or absent from the checkpoint

        def param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
            return nn.Parameter(torch.zeros(shape, dtype=dtype, device=dev), requires_grad=False)

        layer.weight = param((n, k), torch.int8)
        if scheme == "W8A8":
            layer.input_scale = param((len(parts),), torch.float32)
            layer.input_offset = param((len(parts),), torch.float32)
            layer.deq_scale = param((n,), torch.float32)
            layer.quant_bias = param((n,), torch.int32)
            extra = [p for p in ("weight_scale", "weight_offset")
                     if f"{next(iter(parts.values()))}.{p}" in self.description]
        else:
            extra = ["weight_scale", "weight_offset"]
        for p in extra:  # a W8A8 layer's weight_scale/offset are folded into deq_scale
            setattr(layer, p, param((n,), torch.float32))
        layer.load = functools.partial(_load, layer)

    # -- after loading ---------------------------------------------------------------------------
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        scheme = layer.modelslim_scheme
        dtype = self.config.dtype
        if scheme == "W8A16":
            layer.ms_scale = layer.weight_scale.data.to(dtype)
            layer.ms_offset = (-layer.weight_offset.data).to(dtype)  # the kernel adds it
        elif scheme == "W8A8_DYNAMIC":
            if bool(layer.weight_offset.data.ne(0).any()):
                raise NotImplementedError("modelslim: W8A8_DYNAMIC with a non-zero weight_offset "
                                          "(asymmetric weights) is not implemented")
        elif scheme == "W8A8":
            layer.ms_groups = self._static_groups(layer, dtype)

    def _static_groups(self, layer: nn.Module, dtype: torch.dtype) -> list[tuple]:
        """Runs of output rows sharing one input scale/offset: (rows, 1/scale [K], offset [K],
        deq_scale in the kernel's dtype, quant_bias)."""
        k = layer.in_features
        bounds: list[list] = []
        for i, (offset, rows) in enumerate(layer.shards.values()):
            size = rows.size if rows is not None else layer.out_features
            key = (float(layer.input_scale[i]), float(layer.input_offset[i]))
            if bounds and bounds[-1][2] == key and bounds[-1][1] == offset:
                bounds[-1][1] = offset + size
            else:
                bounds.append([offset, offset + size, key])
        groups = []
        for start, end, (scale, off) in bounds:
            deq = layer.deq_scale.data[start:end].contiguous()
            if dtype == torch.float16:  # the op's float16 output takes the int64 form
                deq = torch_npu.npu_trans_quant_param(deq)
            groups.append((slice(start, end),
                           torch.full((k,), 1.0 / scale, dtype=dtype, device=deq.device),
                           torch.full((k,), off, dtype=dtype, device=deq.device),
                           deq, layer.quant_bias.data[start:end].contiguous()))
        return groups

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        scheme = layer.modelslim_scheme
        if scheme == "FLOAT":
            return F.linear(x, layer.weight, layer.bias)
        if scheme == "W8A16":
            return weight_only_int8(x, layer.weight, layer.ms_scale, layer.ms_offset, layer.bias)
        if scheme == "W8A8_DYNAMIC":
            return dynamic_w8a8(x, layer.weight, layer.weight_scale, layer.bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        outs = []
        for rows, inv_scale, offset, deq, qbias in layer.ms_groups:
            xq = torch_npu.npu_quantize(x2, inv_scale, offset, torch.qint8, -1, False)
            outs.append(torch_npu.npu_quant_matmul(xq, layer.weight[rows].t(), deq, bias=qbias,
                                                   output_dtype=x.dtype))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return out.view(*shape[:-1], out.shape[-1])


def _load(layer: LinearBase, param: str, loaded: Any, shard: Any = None) -> None:
    """The layer's loader for modelslim tensors: per-tensor input scale/offset kept per part,
    [N, 1] scales flattened, int64 deq_scale decoded; a row-parallel quant_bias added once."""
    if param in _PER_TENSOR:
        t = materialize(loaded).reshape(-1)
        if t.numel() != 1:
            raise ValueError(f"modelslim {param}: per-tensor [1] expected, got {tuple(t.shape)}")
        getattr(layer, param).data[list(layer.shards).index(shard)] = t.float()[0]
        return
    if param in _PER_CHANNEL:
        t = materialize(loaded)
        if t.dim() == 2:
            if t.shape[1] != 1:
                raise NotImplementedError(f"modelslim {param} {tuple(t.shape)}: per-group scales "
                                          f"are not implemented")
            t = t[:, 0]
        loaded = _float_from_int64(t) if t.dtype == torch.int64 else t.float()
    LinearBase.load(layer, param, loaded, shard)
    if param == "quant_bias" and layer.input_slice is not None and layer.tp_rank != 0:
        layer.quant_bias.data.zero_()  # added once, by rank 0, before the all-reduce
