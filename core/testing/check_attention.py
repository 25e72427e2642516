"""Attention backends against the core's ``torch_native`` reference.

For every dtype and page size, one backend object (as a model holds one) runs every scenario of
``batches.SCENARIOS`` in turn (so stale per-batch state shows), over two layers with their own
caches. Checked per layer: the output [T, H, D] of the real rows against the reference's, and the
whole KV cache after the step against the reference's (the new k/v at their slots, nothing else
touched), but for page 0, the padding rows' scratch page (see ``batches``). A
backend with ``fuses_rotary`` runs each scenario twice: given rotated q/k, and given q/k straight
from a fused QKV projection plus the rotary table (the reference then gets them rotated by
``layer_ops.rotary_ref``). With an fp8 cache the new k/v are values fp8 holds exactly, so a
backend may attend over them as given or as stored; only fused rotary (k rotated, then rounded to
fp8 by each side) is held to the looser ``Tolerances.fp8_rounding``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from infer.core.model.layers.rotary import rope_table
from infer.core.ops.attention import FP8_DTYPES, AttentionConfig, RotaryArgs
from infer.core.ops.layer_ops import rotary_ref
from infer.core.ops.reference.attention import TorchNativeAttention
from infer.core.testing.batches import SCENARIOS, rel_err, scenario_batch
from infer.core.testing.outcome import ConformanceFailure, Outcome, Tolerances, build

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 8, 2, 64, 2
ROPE_POSITIONS = 256


def check_attention(name: str, factory: Callable[[AttentionConfig], Any], device: torch.device,
                    dtypes: tuple[torch.dtype, ...], page_sizes: tuple[int, ...],
                    tol: Tolerances, seed: int = 0,
                    kv_dtypes: tuple[torch.dtype, ...] = ()) -> Outcome:
    """``kv_dtypes``: cache dtypes tried besides the activation dtype (fp8 caches, whose
    per-tensor scales stay 1.0)."""
    outcome = Outcome(f"attention backend {name!r}")
    for dtype in dtypes:
        for page in page_sizes:
            for kv in (dtype, *kv_dtypes):
                label = f"{str(dtype)[6:]} page {page}" + (f" kv {str(kv)[6:]}" if kv != dtype else "")
                with outcome.case(label):
                    _run_config(factory, device, dtype, kv, page, tol, seed)
    return outcome.raise_if_failed()


def _run_config(factory: Callable[[AttentionConfig], Any], device: torch.device,
                dtype: torch.dtype, kv_dtype: torch.dtype, page: int, tol: Tolerances,
                seed: int) -> None:
    cfg = AttentionConfig(num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                          scale=HEAD_DIM ** -0.5, page_size=page, dtype=dtype, kv_dtype=kv_dtype,
                          device=device, num_layers=LAYERS, max_batch_size=16,
                          max_context_len=ROPE_POSITIONS)
    backend, reference = build(factory, cfg), TorchNativeAttention(cfg)
    gen = torch.Generator().manual_seed(seed)
    modes = [False, True] if getattr(backend, "fuses_rotary", False) else [False]
    errors = []
    for scenario in SCENARIOS:
        for fused in modes:
            where = f"{scenario}{' fused-rotary' if fused else ''}"
            try:
                _run_scenario(backend, reference, scenario, fused, cfg, gen, tol)
            except NotImplementedError:
                raise  # the backend refuses this dtype / page size
            except ConformanceFailure as e:
                errors.append(f"{where}: {e}")
            except Exception as e:  # valid input: raising is a failure; the others still run
                errors.append(f"{where}: raised {type(e).__name__}: {e}")
    if errors:
        raise ConformanceFailure("\n    ".join([""] + errors))


def _run_scenario(backend: Any, reference: TorchNativeAttention, scenario: str, fused: bool,
                  cfg: AttentionConfig, gen: torch.Generator, tol: Tolerances) -> None:
    dev, dtype, d = cfg.device, cfg.dtype, cfg.head_dim
    batch = scenario_batch(scenario, cfg.page_size, dev, gen)
    meta = batch.meta
    shape = (batch.num_pages, cfg.page_size, cfg.num_kv_heads, d)
    caches = [torch.randn(shape, generator=gen).to(cfg.kv_dtype).to(dev) for _ in range(2 * LAYERS)]
    ref_caches = [c.clone() for c in caches]
    backend.plan(meta)
    reference.plan(meta)
    cos_sin = rope_table(d, ROPE_POSITIONS, {"rope_theta": 10000.0}).to(dev)
    t = meta.num_tokens
    fp8 = cfg.kv_dtype in FP8_DTYPES
    bound = tol.for_dtype(dtype)
    # rotated k is not exact in fp8: rounded once by each, maybe differently (k cache and output)
    # (e5m2 keeps one mantissa bit fewer than e4m3: twice the rounding step)
    fp8_step = tol.fp8_rounding * (2 if cfg.kv_dtype == torch.float8_e5m2 else 1)
    rounded_bound = max(bound, fp8_step) if fp8 and fused else bound
    for layer in range(LAYERS):
        # q, k, v as views of one fused projection, as the model hands them over
        qkv = torch.randn(t, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, generator=gen)
        if fp8:  # values an fp8 cache holds exactly: a backend may attend over the new k/v as
            qkv = qkv.to(cfg.kv_dtype).float()  # given or as stored, and round either way
        qkv = qkv.to(dtype).to(dev)
        q, k, v = (x.view(t, -1, d) for x in qkv.split(
            [cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d], dim=-1))
        kc, vc = caches[2 * layer], caches[2 * layer + 1]
        rkc, rvc = ref_caches[2 * layer], ref_caches[2 * layer + 1]
        rq, rk, rv = q.clone(), k.clone(), v.clone()  # the backend may rotate its q/k in place
        if fused:
            out = backend.forward(q, k, v, kc, vc, layer,
                                  rotary=RotaryArgs(batch.positions, cos_sin, d))
            rq, rk = rotary_ref(batch.positions, rq.float(), rk.float(), cos_sin, d)
            rq, rk = rq.to(dtype), rk.to(dtype)
        else:
            out = backend.forward(q, k, v, kc, vc, layer)
        expect = reference.forward(rq, rk, rv, rkc, rvc, layer)
        if tuple(out.shape) != tuple(expect.shape) or out.dtype != dtype:
            raise ConformanceFailure(f"layer {layer}: output {tuple(out.shape)} {out.dtype}, "
                                     f"expected {tuple(expect.shape)} {dtype}")
        real = batch.real_tokens
        err = rel_err(out[real], expect[real])
        if not err <= rounded_bound:
            raise ConformanceFailure(f"layer {layer}: output relative error {err:.3g} > "
                                     f"{rounded_bound:g}")
        # page 0 is the padding rows' scratch page: written in no defined order, not compared
        if fused:  # k rotated in float32 by both, rounded once: equal up to the last bit
            k_err = rel_err(kc[1:], rkc[1:])
            k_ok = k_err <= rounded_bound
        else:
            k_ok, k_err = _same(kc[1:], rkc[1:]), None
        v_ok = _same(vc[1:], rvc[1:])
        if not (k_ok and v_ok):
            k_text = "differs" if k_err is None else f"relative error {k_err:.3g} > {rounded_bound:g}"
            raise ConformanceFailure(
                f"layer {layer}: KV cache after the step differs from the reference's (new k/v at "
                f"the wrong slots, or other slots touched): k {'equal' if k_ok else k_text}, "
                f"v {'equal' if v_ok else 'differs'}")

def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (byte views: fp8 has no comparison kernels on every device)."""
    if a.dtype in FP8_DTYPES:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)
