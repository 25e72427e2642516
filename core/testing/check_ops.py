"""Linear methods, MoE runners and per-layer ops against the core's plain-torch references.

Linear: the method builds a layer (``create_weights``), the kit fills its dense ``weight`` [out, in]
(and ``bias``) as the loader does, then ``process_weights_after_loading`` and ``apply`` on inputs
of 1 to 64 rows (and a 3-D input). The reference is ``DenseLinearMethod`` on the same dense weight:
within the dtype's bound for the unquantized method (key None), within ``Tolerances.quantized``
for a quantization. For ``"gguf"`` the layer is given what the core's GGUF seam gives it
(``gguf_qtype``, ``gguf_raw`` and the dequantised ``weight``, see ``infer.core.model.layers.linear``)
for Q8_0, Q4_0 and Q4_1 blocks, and the reference uses the dequantised weight. A method whose
layer has no dense weight to fill (weights that arrive quantized from the checkpoint) cannot be
built by the kit: ``KitCannotBuild``.

MoE: ``apply`` with float32 routing weights and int64 expert ids (as the MoE layer passes them),
top-2 and top-1 (the expert-parallel path's rows), experts left without tokens included.

Layer ops: each registered function against ``layer_ops.REFERENCE`` on fresh copies of the inputs
(an op may work in place); an op may decline an input by returning None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from infer.core.ops.layer_ops import OPS, REFERENCE
from infer.core.ops.linear import LinearConfig
from infer.core.ops.reference.linear import DenseLinearMethod
from infer.core.ops.reference.moe import TorchMoERunner
from infer.core.testing.batches import rel_err
from infer.core.testing.outcome import ConformanceFailure, OpRefused, Outcome, Tolerances, build
from torch import nn

LINEAR_SHAPES = ((64, 96), (256, 128))  # (in, out): multiples of 32 (GGUF blocks) and 16
LINEAR_ROWS = ((1,), (3,), (8,), (17,), (64,), (2, 5))  # leading dims of x


class KitCannotBuild(Exception):
    """The kit has no way to give this op the inputs it needs (the test reports a skip)."""


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _expect(label: str, out: torch.Tensor, ref: torch.Tensor, bound: float) -> None:
    if tuple(out.shape) != tuple(ref.shape):
        raise ConformanceFailure(f"{label}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    err = rel_err(out, ref)
    if not err <= bound:
        raise ConformanceFailure(f"{label}: relative error {err:.3g} > {bound:g}")


# -- linear ------------------------------------------------------------------------------------
def check_linear(key: str | None, factory: Callable[[LinearConfig], Any], device: torch.device,
                 dtypes: tuple[torch.dtype, ...], tol: Tolerances, seed: int = 0) -> Outcome:
    outcome = Outcome(f"linear method {key!r}")
    qtypes = _gguf_qtypes() if key == "gguf" else [None]
    for dtype in dtypes:
        for qtype in qtypes:
            for k, n in LINEAR_SHAPES:
                for bias in (False, True):
                    label = (f"{str(dtype)[6:]} {n}x{k}{' +bias' if bias else ''}"
                             f"{f' {qtype.name}' if qtype is not None else ''}")
                    with outcome.case(label):
                        _linear_case(key, factory, device, dtype, qtype, k, n, bias, tol,
                                     _gen(seed + k + n + bias))
    return outcome.raise_if_failed()


def _gguf_qtypes() -> list[Any]:
    from gguf import GGMLQuantizationType as Q

    return [Q.Q8_0, Q.Q4_0, Q.Q4_1]


def _linear_case(key: str | None, factory: Callable[[LinearConfig], Any], device: torch.device,
                 dtype: torch.dtype, qtype: Any, k: int, n: int, bias: bool, tol: Tolerances,
                 gen: torch.Generator) -> None:
    cfg = LinearConfig(quantization=key, dtype=dtype, device=device)
    method = build(factory, cfg)
    layer = nn.Module()
    build(method.create_weights, layer, k, n, bias)
    w = getattr(layer, "weight", None)
    if not (isinstance(w, torch.Tensor) and w.is_floating_point() and tuple(w.shape) == (n, k)):
        params = {name: (tuple(p.shape), str(p.dtype)) for name, p in layer.named_parameters()}
        raise KitCannotBuild(f"linear method {key!r}: its layer has no dense weight [{n}, {k}] "
                             f"for the kit to fill (parameters: {params})")
    dense = torch.randn(n, k, generator=gen) / k ** 0.5
    if qtype is not None:
        from gguf.quants import dequantize, quantize

        raw = quantize(dense.numpy(), qtype)
        dense = torch.from_numpy(np.ascontiguousarray(dequantize(raw, qtype))).float()
        layer.gguf_qtype, layer.gguf_raw = qtype, torch.from_numpy(raw).to(device)
    b = torch.randn(n, generator=gen)
    with torch.no_grad():
        layer.weight.copy_(dense.to(dtype))
        if bias:
            layer.bias.copy_(b.to(dtype))
    ref_layer = nn.Module()
    ref_layer.weight = nn.Parameter(dense.to(dtype).to(device), requires_grad=False)
    ref_layer.bias = nn.Parameter(b.to(dtype).to(device), requires_grad=False) if bias else None
    reference = DenseLinearMethod(LinearConfig(None, dtype, device))
    method.process_weights_after_loading(layer)
    bound = tol.for_dtype(dtype) if key is None else tol.quantized
    for lead in LINEAR_ROWS:
        x = torch.randn(*lead, k, generator=gen).to(dtype).to(device)
        with torch.no_grad():
            out = method.apply(layer, x.clone())
            ref = reference.apply(ref_layer, x)
        if out.dtype != dtype:
            raise ConformanceFailure(f"x {tuple(x.shape)}: output dtype {out.dtype}, expected {dtype}")
        _expect(f"x {tuple(x.shape)}", out, ref, bound)


# -- MoE ---------------------------------------------------------------------------------------
MOE_EXPERTS, MOE_DIM, MOE_INTER = 8, 64, 96


def check_moe(name: str, factory: Callable[[], Any], device: torch.device,
              dtypes: tuple[torch.dtype, ...], tol: Tolerances, seed: int = 0) -> Outcome:
    outcome = Outcome(f"MoE runner {name!r}")
    try:
        runner = build(factory)
    except OpRefused as e:
        raise ConformanceFailure(f"MoE runner {name!r} could not be built: {e}") from None
    reference = TorchMoERunner()
    for dtype in dtypes:
        for tokens in (1, 5, 33):
            for top_k in (2, 1):
                label = f"{str(dtype)[6:]} {tokens} tokens top-{top_k}"
                with outcome.case(label):
                    gen = _gen(seed + tokens * 10 + top_k)
                    e, d, i = MOE_EXPERTS, MOE_DIM, MOE_INTER
                    hidden = torch.randn(tokens, d, generator=gen).to(dtype).to(device)
                    w13 = (torch.randn(e, 2 * i, d, generator=gen) / d ** 0.5).to(dtype).to(device)
                    w2 = (torch.randn(e, d, i, generator=gen) / i ** 0.5).to(dtype).to(device)
                    probs = torch.softmax(torch.randn(tokens, e, generator=gen), dim=-1)
                    weights, ids = probs.topk(top_k, dim=-1)  # float32 [T, k], int64 [T, k]
                    weights, ids = weights.to(device), ids.to(device)
                    with torch.no_grad():
                        out = runner.apply(hidden, w13, w2, weights, ids)
                        ref = reference.apply(hidden.float(), w13.float(), w2.float(), weights, ids)
                    _expect("output", out, ref, tol.for_dtype(dtype))
    return outcome.raise_if_failed()


# -- layer ops ---------------------------------------------------------------------------------
def _layer_op_inputs(name: str, dtype: torch.dtype, device: torch.device,
                     gen: torch.Generator) -> list[tuple[str, tuple[Any, ...]]]:
    """(label, args) for each input of op ``name`` the kit tries."""
    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    cases: list[tuple[str, tuple[Any, ...]]] = []
    if name == "rms_norm":
        for n, d in ((1, 64), (7, 576), (64, 256)):
            w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype).to(device)
            cases.append((f"{n}x{d}", (rnd(n, d), w, 1e-6, None)))
            cases.append((f"{n}x{d} +residual", (rnd(n, d), w, 1e-5, rnd(n, d))))
    elif name == "rotary":
        from infer.core.model.layers.rotary import rope_table

        for t, h, hkv, d, r in ((1, 8, 2, 64, 64), (9, 4, 4, 128, 128), (33, 8, 2, 64, 32)):
            cos_sin = rope_table(r, 512, {"rope_theta": 10000.0}).to(device)
            pos = torch.randint(0, 512, (t,), generator=gen).to(device)
            cases.append((f"{t} tokens {h}/{hkv} heads d{d} r{r}", (pos, rnd(t, h, d), rnd(t, hkv, d), cos_sin, r)))
            qkv = rnd(t, (h + 2 * hkv) * d)  # q and k as views of a fused projection
            q, k = qkv[:, :h * d].view(t, h, d), qkv[:, h * d:(h + hkv) * d].view(t, hkv, d)
            cases.append((f"{t} tokens d{d} r{r} views", (pos, q, k, cos_sin, r)))
    elif name == "silu_and_mul":
        for t, i in ((1, 64), (13, 96), (64, 1536)):
            cases.append((f"{t}x{2 * i}", (rnd(t, 2 * i),)))
    elif name == "residual_add":
        for t, d in ((1, 64), (7, 576), (512, 576), (3, 41)):
            cases.append((f"{t}x{d}", (rnd(t, d), rnd(t, d))))
    return cases


def _fresh(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def check_layer_op(name: str, fn: Callable[..., Any], device: torch.device,
                   dtypes: tuple[torch.dtype, ...], tol: Tolerances, seed: int = 0) -> Outcome:
    """``Outcome.refused`` lists the inputs the op declined (returned None for)."""
    outcome = Outcome(f"layer op {name!r}")
    if name not in OPS:
        raise ConformanceFailure(f"layer op {name!r} is registered, but the core knows only "
                                 f"{', '.join(OPS)}: the model never calls it")
    for dtype in dtypes:
        for label, args in _layer_op_inputs(name, dtype, device, _gen(seed)):
            label = f"{str(dtype)[6:]} {label}"
            with outcome.case(label):
                with torch.no_grad():
                    out = fn(*_fresh(args))
                    if out is None:
                        raise OpRefused("declined (the reference runs)")
                    ref = REFERENCE[name](*_fresh(args))
                outs = out if isinstance(out, tuple) else (out,)
                refs = ref if isinstance(ref, tuple) else (ref,)
                if len(outs) != len(refs):
                    raise ConformanceFailure(f"returned {len(outs)} values, the reference {len(refs)}")
                for j, (o, r) in enumerate(zip(outs, refs, strict=True)):
                    if (o is None) != (r is None):
                        raise ConformanceFailure(f"value {j}: {o is None=} but reference {r is None=}")
                    if r is not None:
                        _expect(f"value {j}", o, r, tol.for_dtype(dtype))
    return outcome.raise_if_failed(every_refusal_fails=False)
