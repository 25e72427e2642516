# ruff: noqa: ANN001  (Triton kernel parameters are untyped pointers/scalars by convention)
"""Small-M GEMM (GEMV) in Triton: y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) for M <= 8.

Batch-1..8 decode reads every weight once per step and does almost no arithmetic, so the GEMM is
bound by HBM bandwidth. Each program owns BLOCK_N output columns for all M rows and streams its
BLOCK_N weight rows along K in BLOCK_K chunks (wide contiguous loads), so W is read exactly once;
the M rows are a static loop of multiply + row sums in float32 (no tl.dot: M is too small for
tensor cores, and Triton's CPU interpreter computes bf16 tl.dot wrongly).

Split-K (SPLIT_K > 1, grid N-blocks x SPLIT_K) runs in ONE launch: each split writes its float32
partial to a workspace and bumps a per-N-block arrival counter; the split that arrives last sums
the partials in a fixed order (deterministic), adds the bias, writes y and sets the counter back
to 0. The counters therefore stay zero between launches, which keeps a captured CUDA graph valid.

Which implementation runs for a shape is chosen by ``pick``, by timing on the GPU. The
``INFER_CUDA_GEMV`` environment variable (read on each ``pick``) overrides it for benchmarking:
    off   always cuBLAS (F.linear)
    auto  (default) the faster of cuBLAS and the best Triton config, timed once per shape
    force always the fastest Triton config (to profile the kernel inside the model)
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from infer_cuda.kernels.common import arrival_counters, interpreting

log = logging.getLogger(__name__)

MAX_M = 8
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
Config = tuple[int, int, int, int, int]
Choice = Config | str  # a Config, or "cublas"
Baseline = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (x, w, w_scale) -> y
# Small N-blocks and split-K keep all 132 SMs of an H100 busy on N = 4096; wide K chunks keep
# many bytes in flight per thread. num_stages > 1 prefetches K chunks through shared memory
# (cp.async; Triton pipelines loads that feed no tl.dot only in a tl.range with num_stages set),
# num_stages = 1 loads straight into registers. Timed per shape: the list only has to hold the
# winner.
CONFIGS: list[Config] = [
    (16, 512, 1, 4, 1),
    (16, 512, 1, 4, 3),
    (32, 256, 1, 4, 3),
    (64, 128, 1, 4, 4),
    (8, 512, 1, 4, 3),
    (16, 256, 2, 4, 4),
    (32, 256, 2, 8, 3),
    (16, 512, 4, 4, 2),
    (32, 256, 4, 8, 3),
]
MARGIN = 0.98  # Triton must beat cuBLAS by 2% (above timing noise) to be chosen


@triton.jit
def _gemv_kernel(
    X, W, Bias, Y, Part, Counters, WScale,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, NUM_STAGES: tl.constexpr,
    W_SCALED: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn  # [BN, 1]; N * K may pass 2**31
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)

    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # [BN, BM]: n-major like the weight tile
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # M == 1: the sum over K waits for the end
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        ks = k0 + offs_k
        mask_k = ks < k_end
        if EVEN_N and EVEN_K:  # no mask: keeps the loads 16-byte vectors
            w = tl.load(w_rows + ks[None, :])
        else:
            w = tl.load(w_rows + ks[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        w = w.to(tl.float32)  # [BN, BK]
        if BLOCK_M == 1:  # no cross-thread reduction inside the loop
            x0 = tl.load(X + ks, mask=mask_k, other=0.0)  # [BK]
            acc1 += w * x0.to(tl.float32)[None, :]
        else:
            for m in tl.static_range(BLOCK_M):
                xm = tl.load(X + m * stride_xm + ks, mask=mask_k & (m < M), other=0.0)  # [BK]
                s = tl.sum(w * xm.to(tl.float32)[None, :], 1)  # [BN]
                acc = tl.where(offs_m[None, :] == m, acc + s[:, None], acc)
    if BLOCK_M == 1:
        acc = tl.sum(acc1, 1)[:, None]

    mask_y = mask_n[:, None] & (offs_m[None, :] < M)
    y_ptrs = Y + offs_m[None, :] * stride_ym + offs_n[:, None]
    if SPLIT_K == 1:
        if W_SCALED:  # fp8 weights: one scale per output channel, applied once at the end
            acc *= tl.load(WScale + offs_n, mask=mask_n, other=0.0)[:, None]
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=mask_y)
    else:
        part_ptrs = Part + offs_m[None, :] * N + offs_n[:, None]  # Part [SPLIT_K, M, N] float32
        tl.store(part_ptrs + pid_k * M * N, acc, mask=mask_y)
        tl.debug_barrier()  # every thread's partial is stored before the release below
        arrived = tl.atomic_add(Counters + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last split of this N-block: all partials are visible
            total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            for s in tl.static_range(SPLIT_K):  # fixed order: the same sum whoever comes last
                total += tl.load(part_ptrs + s * M * N, mask=mask_y, other=0.0,
                                 cache_modifier=".cg")  # L2, not a stale L1 line
            if W_SCALED:
                total *= tl.load(WScale + offs_n, mask=mask_n, other=0.0)[:, None]
            if HAS_BIAS:
                total += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=mask_y)
            tl.store(Counters + pid_n, 0)


def _splits(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(splits, K per split): each split a whole number of BLOCK_K chunks, none empty."""
    k_per_split = max(1, triton.cdiv(triton.cdiv(K, split_k), block_k)) * block_k
    return max(1, triton.cdiv(K, k_per_split)), k_per_split


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         config: Config, weight_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (rows may be strided), weight [N, K], bias [N] or None -> y [M, N] in x's dtype.

    M <= 8; x, weight and bias of one dtype (float32, bfloat16 or float16). With
    ``weight_scale`` (float32 [N]) the weight is fp8 and y = (x @ weight^T) * weight_scale
    (+ bias): x is used as it is, in float32 arithmetic (no activation quantization)."""
    M, K = x.shape
    N = weight.shape[0]
    if M > MAX_M:
        raise ValueError(f"gemv handles at most {MAX_M} rows, got x of shape {tuple(x.shape)}; "
                         "use F.linear for larger batches")
    w_ok = (weight.dtype == x.dtype if weight_scale is None else
            weight.dtype in FP8_DTYPES and weight_scale.dtype == torch.float32
            and weight_scale.numel() == N)
    if weight.shape[1] != K or not w_ok or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"gemv: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} "
                         f"{weight.dtype}, bias {None if bias is None else bias.dtype}: weight must "
                         "be [N, K] and all of x's dtype (or fp8 with a float32 [N] weight_scale)")
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    block_n, block_k, split_k, warps, stages = config
    splits, k_per_split = _splits(K, block_k, split_k)
    n_blocks = triton.cdiv(N, block_n)
    part = torch.empty(splits, M, N, dtype=torch.float32, device=x.device) if splits > 1 else y
    counters = arrival_counters(x.device, n_blocks) if splits > 1 else y
    _gemv_kernel[(n_blocks, splits)](
        x, weight, y if bias is None else bias, y, part, counters,
        y if weight_scale is None else weight_scale.reshape(-1),
        M, N, K, k_per_split,
        x.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=splits,
        EVEN_N=N % block_n == 0, EVEN_K=splits * k_per_split == K, HAS_BIAS=bias is not None,
        NUM_STAGES=stages, W_SCALED=weight_scale is not None,
        num_warps=warps, num_stages=stages,
    )
    return y


# -- per-shape choice ---------------------------------------------------------------------------

_CHOICES: dict[tuple, Choice] = {}


def mode() -> str:
    """INFER_CUDA_GEMV: off | auto | force (see the module docstring)."""
    value = os.environ.get("INFER_CUDA_GEMV", "auto")
    if value not in ("off", "auto", "force"):
        raise ValueError(f"INFER_CUDA_GEMV={value!r}: expected off, auto or force")
    return value


def pick(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
         weight: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None,
         baseline: Baseline | None = None) -> Choice:
    """"cublas" or the Triton Config to use for x [M, K] @ W [N, K]^T, timed on first use for
    M's power-of-two bucket (the kernel computes that many rows whatever M is within it).

    Never times while a CUDA graph is being captured (answers "cublas" then, uncached: the warm-up
    before capture makes the choice). Without a GPU (interpreter, CPU) it answers "cublas", or
    CONFIGS[0] under INFER_CUDA_GEMV=force. ``weight`` (optional): the layer's weight, timed in
    place of a fresh copy to save memory. fp8 weights: ``weight`` (fp8) and ``weight_scale`` are
    required, and ``baseline(x, w, weight_scale)`` is the caller's own path (what "cublas" then
    stands for)."""
    how = mode()
    if how == "off":
        return "cublas"
    device = torch.device(device)
    M = triton.next_power_of_2(M)
    wdtype = dtype if weight_scale is None else weight.dtype
    key = (how, M, N, K, dtype, wdtype, device)
    if key in _CHOICES:
        return _CHOICES[key]
    if interpreting() or device.type != "cuda":
        return CONFIGS[0] if how == "force" else "cublas"
    if torch.cuda.is_current_stream_capturing():
        return "cublas"
    try:
        times = time_choices(M, N, K, dtype, device, with_cublas=how == "auto", weight=weight,
                             weight_scale=weight_scale, baseline=baseline)
    except torch.cuda.OutOfMemoryError:
        log.warning("gemv [%d, %d] x [%d, %d]: no memory to time it, using cuBLAS", M, K, N, K)
        times = {}
    best = min(times, key=times.get) if times else "cublas"
    if how == "auto" and best != "cublas" and times[best] > MARGIN * times["cublas"]:
        best = "cublas"
    log.info("gemv M=%d N=%d K=%d %s/%s: %s (us: %s)", M, N, K, dtype, wdtype, best,
             {str(c): round(t * 1e3, 1) for c, t in times.items()})
    _CHOICES[key] = best
    return best


def candidates(K: int) -> list[Config]:
    """CONFIGS without those whose split count K cannot fill (they would repeat another)."""
    seen, out = set(), []
    for cfg in CONFIGS:
        eff = (cfg[0], cfg[1], _splits(K, cfg[1], cfg[2])[0], cfg[3], cfg[4])
        if eff not in seen:
            seen.add(eff)
            out.append(cfg)
    return out


def time_choices(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
                 with_cublas: bool = True, weight: torch.Tensor | None = None,
                 weight_scale: torch.Tensor | None = None, baseline: Baseline | None = None
                 ) -> dict[Choice, float]:
    """Milliseconds per call of cuBLAS (F.linear, or ``baseline`` for fp8 weights) and each
    Triton config that compiles.

    Each is timed as a CUDA graph of back-to-back calls over rotating weight copies that
    together exceed twice the L2 cache, as in a decode graph: weights come from HBM, and host
    launch cost is not counted."""
    wdtype = dtype if weight_scale is None else weight.dtype
    wbytes = N * K * torch.finfo(wdtype).bits // 8
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    copies = max(1, math.ceil(2 * l2 / max(wbytes, 1)))
    weights = [] if weight is None else [weight]
    weights += [torch.randn(N, K, dtype=dtype, device=device).to(wdtype)
                for _ in range(copies - len(weights))]
    x = torch.randn(M, K, dtype=dtype, device=device)
    fns: dict[Choice, Callable[[torch.Tensor], torch.Tensor]] = {}
    if with_cublas:
        fns["cublas"] = ((lambda w: F.linear(x, w)) if baseline is None
                         else (lambda w: baseline(x, w, weight_scale)))
    for cfg in candidates(K):
        fns[cfg] = lambda w, cfg=cfg: gemv(x, w, None, cfg, weight_scale)
    calls = weights * math.ceil(8 / len(weights))  # >= 8 calls a replay: event cost amortised
    if weight_scale is None:
        expect = F.linear(x, weights[0]).float()
    else:  # exact product of what the kernel reads (the baseline also rounds x to fp8)
        expect = (x.float() @ weights[0].float().t()) * weight_scale.reshape(1, -1)
    times: dict[Choice, float] = {}
    for choice, fn in fns.items():
        try:
            times[choice] = _graph_ms(lambda fn=fn: [fn(w) for w in calls]) / len(calls)
        except Exception as e:  # a config the compiler rejects (resources): skip it
            if choice == "cublas":
                raise
            log.debug("gemv config %s failed: %s", choice, e)
            continue
        if choice == "cublas":
            continue
        # a config is only a candidate if it computes what it should, on this GPU
        err = ((fn(weights[0]).float() - expect).norm() / expect.norm().clamp_min(1e-30)).item()
        if not err < 1e-2:
            log.warning("gemv config %s disagrees with the reference (relative error %.2e); "
                        "not used",
                        choice, err)
            del times[choice]
    return times


def _graph_ms(run: Callable[[], object]) -> float:
    from triton.testing import do_bench

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile, cuBLAS handles and workspaces before capture
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        run()
    return do_bench(graph.replay, warmup=5, rep=25, return_mode="median")
