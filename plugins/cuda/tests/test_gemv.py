"""The small-M Triton GEMV against F.linear (fresh random inputs each case), its split-K counters,
the per-shape choice and the CUDA dense linear method that dispatches to it.

Runs compiled on a GPU, or on the CPU under TRITON_INTERPRET=1 (CI); the timed choice and CUDA
graph replay run on a GPU only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from infer_cuda.kernels import gemv as g
from infer_cuda.kernels.common import arrival_counters
from kernel_utils import CAN_RUN_KERNELS, INTERPRET, KERNEL_DEVICE, SKIP_REASON, bf16_tol, rel_err
from torch import nn

pytestmark = pytest.mark.skipif(not CAN_RUN_KERNELS, reason=SKIP_REASON)
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                               reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")

# small blocks, so that K <= 256 still splits (the production CONFIGS do not split K < 512)
SPLIT_CONFIGS = [(16, 32, 3, 4, 1), (64, 64, 2, 4, 1)]


def _inputs(M, N, K, dtype, bias):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = torch.randn(M, K, generator=gen).to(dtype).to(KERNEL_DEVICE)
    w = torch.randn(N, K, generator=gen).to(dtype).to(KERNEL_DEVICE)
    b = torch.randn(N, generator=gen).to(dtype).to(KERNEL_DEVICE) if bias else None
    return x, w, b


def _check(out, x, w, b):
    """bf16 / fp16: relative error. float32: every element within the summation bound
    (K + 1) 2^-23 (sum_k |x_k w_k| + |b|) of the float64 product, whatever the order of the sum
    (a relative error over the tensor fails when one output cancels near zero: N = 1)."""
    assert out.shape == (x.shape[0], w.shape[0]) and out.dtype == x.dtype
    if out.numel() == 0:
        return
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    if x.dtype != torch.float32:
        assert rel_err(out, ref) < bf16_tol()
        return
    mag = F.linear(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    bound = (x.shape[1] + 1) * 2.0 ** -23 * mag
    err = (out.double().cpu() - ref.cpu()).abs()
    assert torch.isfinite(out).all() and (err <= bound.cpu()).all(), (err - bound.cpu()).max()


@pytest.mark.parametrize("config", g.CONFIGS + SPLIT_CONFIGS, ids=str)
def test_each_config(config):
    x, w, b = _inputs(3, 37, 100, torch.float32, bias=True)
    _check(g.gemv(x, w, b, config), x, w, b)


@pytest.mark.parametrize("M,N,K,dtype,bias", [
    (1, 1, 16, torch.float32, True),
    (3, 37, 100, torch.bfloat16, False),
    (8, 128, 256, torch.bfloat16, True),
    (1, 300, 256, torch.float32, False),
    (2, 300, 16, torch.float16, True),
    (0, 37, 100, torch.bfloat16, True),
])
def test_shapes(M, N, K, dtype, bias):
    x, w, b = _inputs(M, N, K, dtype, bias)
    _check(g.gemv(x, w, b, SPLIT_CONFIGS[1]), x, w, b)


def test_strided_rows():
    x, w, b = _inputs(3, 37, 100 + 28, torch.bfloat16, bias=True)
    x = x[:, 20:120]  # row stride 128, not K
    assert not x.is_contiguous()
    _check(g.gemv(x, w[:, :100].contiguous(), b, SPLIT_CONFIGS[0]), x, w[:, :100], b)
    _check(g.gemv(x.t().contiguous().t(), w[:, :100], b, SPLIT_CONFIGS[0]), x, w[:, :100], b)


def test_split_k_counters_reset():
    x, w, b = _inputs(2, 37, 100, torch.float32, bias=True)
    config = SPLIT_CONFIGS[0]
    first = g.gemv(x, w, b, config)
    counters = arrival_counters(x.device, -(-37 // config[0]))  # the buffer the launch used
    assert counters.numel() >= 3 and not counters.any()  # 3 N-blocks, each back to 0
    assert torch.equal(g.gemv(x, w, b, config), first)  # fixed-order sum: bitwise the same
    _check(first, x, w, b)


def test_rejects_mismatched_inputs():
    x, w, _ = _inputs(9, 8, 16, torch.float32, bias=False)
    with pytest.raises(ValueError, match="at most 8 rows"):
        g.gemv(x, w, None, SPLIT_CONFIGS[0])
    with pytest.raises(ValueError, match="x's dtype"):
        g.gemv(x[:2], w.to(torch.bfloat16), None, SPLIT_CONFIGS[0])


@pytest.mark.skipif(not INTERPRET, reason="the choice without a GPU")
def test_pick_without_gpu(monkeypatch):
    args = (1, 64, 64, torch.bfloat16, torch.device("cpu"))
    monkeypatch.delenv("INFER_CUDA_GEMV", raising=False)
    assert g.pick(*args) == "cublas"
    monkeypatch.setenv("INFER_CUDA_GEMV", "off")
    assert g.pick(*args) == "cublas"
    monkeypatch.setenv("INFER_CUDA_GEMV", "force")
    assert g.pick(*args) == g.CONFIGS[0]
    monkeypatch.setenv("INFER_CUDA_GEMV", "fast")
    with pytest.raises(ValueError, match="INFER_CUDA_GEMV='fast'"):
        g.pick(*args)


def test_bad_mode_is_a_start_up_error(monkeypatch):
    """The linear method refuses a bad INFER_CUDA_GEMV when the model is built (a ConfigError,
    reported as such), not in the first forward."""
    from infer.core.config.flags import ConfigError

    monkeypatch.setenv("INFER_CUDA_GEMV", "fast")
    with pytest.raises(ConfigError, match="expected off, auto or force"):
        _layer(8, 16, torch.bfloat16)


def _layer(N, K, dtype, bias=True):
    from infer.core.ops.linear import LinearConfig
    from infer_cuda.ops.linear_dense import CudaDenseLinearMethod

    method = CudaDenseLinearMethod(LinearConfig(None, dtype, torch.device(KERNEL_DEVICE)))
    layer = nn.Module()
    method.create_weights(layer, K, N, bias)
    _, w, b = _inputs(0, N, K, dtype, bias)
    layer.weight.data = w
    if bias:
        layer.bias.data = b
    return method, layer


@pytest.mark.parametrize("lead,gemv_calls", [((2, 3), 1), ((9,), 0)], ids=["M=6", "M=9"])
def test_method_dispatch(monkeypatch, lead, gemv_calls):
    """force: small M takes the GEMV (3-d x flattened), large M takes F.linear."""
    monkeypatch.setenv("INFER_CUDA_GEMV", "force")
    method, layer = _layer(37, 64, torch.bfloat16)
    x = torch.randn(*lead, 64).to(torch.bfloat16).to(KERNEL_DEVICE)
    method.apply(layer, x)  # on a GPU the first call times every config through g.gemv
    calls = []
    real = g.gemv
    monkeypatch.setattr(g, "gemv", lambda *a: calls.append(a) or real(*a))
    out = method.apply(layer, x)
    assert out.shape == (*lead, 37) and len(calls) == gemv_calls
    _check(out.reshape(-1, 37), x.reshape(-1, 64), layer.weight, layer.bias)


@pytest.mark.parametrize("how", ["auto", "off"])
def test_method_falls_back_to_linear(monkeypatch, how):
    if how == "auto" and not INTERPRET:
        pytest.skip("auto times the GEMV on a GPU (test_gpu_pick)")
    monkeypatch.setenv("INFER_CUDA_GEMV", how)
    monkeypatch.setattr(g, "gemv", lambda *a: pytest.fail("GEMV called"))
    method, layer = _layer(37, 64, torch.bfloat16)
    x = torch.randn(1, 64).to(torch.bfloat16).to(KERNEL_DEVICE)
    assert torch.equal(method.apply(layer, x), F.linear(x, layer.weight, layer.bias))


def test_custom_op_compiles_without_graph_break(monkeypatch):
    """Under torch.compile the small-M call is the one opaque op, in a single graph."""
    import infer_cuda.ops.linear_dense  # noqa: F401 (registers infer_cuda::gemv)

    monkeypatch.setenv("INFER_CUDA_GEMV", "force")
    method, layer = _layer(37, 64, torch.bfloat16)
    x = torch.randn(2, 64).to(torch.bfloat16).to(KERNEL_DEVICE)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda t: method.apply(layer, t), backend=backend, fullgraph=True)
    _check(compiled(x), x, layer.weight, layer.bias)
    assert len(graphs) == 1 and torch.ops.infer_cuda.gemv in graphs[0]
    torch.library.opcheck(torch.ops.infer_cuda.gemv.default, (x, layer.weight, layer.bias),
                          test_utils=("test_schema", "test_faketensor"))


# -- fp8 weights (``--quantization fp8``) ---------------------------------------------------------


def _fp8_inputs(M, N, K, bias, gen_seed=None):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31 if gen_seed is None else gen_seed)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(KERNEL_DEVICE)
    w = torch.randn(N, K, generator=gen).clamp(-8, 8).to(torch.float8_e4m3fn).to(KERNEL_DEVICE)
    scale = (torch.rand(N, generator=gen) + 0.5).to(KERNEL_DEVICE)  # float32 [N]
    b = torch.randn(N, generator=gen).to(torch.bfloat16).to(KERNEL_DEVICE) if bias else None
    return x, w, scale, b


def _fp8_ref(x, w, scale, b):
    """The exact product of what the kernel reads: bf16 x, fp8 w, per-channel scale."""
    ref = (x.double() @ w.double().t()) * scale.double()[None, :]
    return ref if b is None else ref + b.double()


@pytest.mark.parametrize("config", g.CONFIGS[:2] + SPLIT_CONFIGS, ids=str)
@pytest.mark.parametrize("M", [1, 3])
def test_fp8_weights_with_channel_scales(config, M):
    x, w, scale, b = _fp8_inputs(M, 37, 100, bias=M == 3)
    out = g.gemv(x, w, b, config, weight_scale=scale)
    assert out.shape == (M, 37) and out.dtype == torch.bfloat16
    assert rel_err(out, _fp8_ref(x, w, scale, b)) < bf16_tol()


def test_fp8_weights_need_a_float32_scale_per_channel():
    x, w, scale, _ = _fp8_inputs(1, 37, 64, bias=False)
    with pytest.raises(ValueError, match="weight_scale"):
        g.gemv(x, w, None, g.CONFIGS[0])  # fp8 weight, no scale
    with pytest.raises(ValueError, match="weight_scale"):
        g.gemv(x, w, None, g.CONFIGS[0], weight_scale=scale[:5])


def _fp8_layer(N, K, bias):
    from infer.core.ops.linear import LinearConfig
    from infer_cuda.ops.linear_fp8 import Fp8LinearMethod

    method = Fp8LinearMethod(LinearConfig("fp8", torch.bfloat16, torch.device(KERNEL_DEVICE)))
    layer = nn.Module()
    method.create_weights(layer, K, N, bias)
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    layer.weight.data = torch.randn(N, K, generator=gen).to(torch.bfloat16).to(KERNEL_DEVICE)
    if bias:
        layer.bias.data = torch.randn(N, generator=gen).to(torch.bfloat16).to(KERNEL_DEVICE)
    method.process_weights_after_loading(layer)
    return method, layer


@pytest.mark.parametrize("lead,gemv_calls", [((2, 3), 1), ((9,), 0)], ids=["M=6", "M=9"])
def test_fp8_method_small_m_takes_the_gemv(monkeypatch, lead, gemv_calls):
    """force: small M runs the GEMV on the fp8 weight and its scales (x not quantized), large M
    the quantize + _scaled_mm path (not called here when the GEMV runs)."""
    from infer_cuda.ops import linear_fp8

    monkeypatch.setenv("INFER_CUDA_GEMV", "force")
    method, layer = _fp8_layer(48, 64, bias=True)
    x = torch.randn(*lead, 64).to(torch.bfloat16).to(KERNEL_DEVICE)
    if gemv_calls:  # on a GPU the first call times every config through g.gemv
        method.apply(layer, x)
    calls = []
    real = g.gemv
    monkeypatch.setattr(g, "gemv", lambda *a: calls.append(a) or real(*a))
    if gemv_calls == 0:  # large M: the torch path, stubbed where this torch has no CPU fp8 GEMM
        sentinel = torch.zeros(9, 48, dtype=torch.bfloat16, device=KERNEL_DEVICE)
        monkeypatch.setattr(linear_fp8, "scaled_mm_linear", lambda *a: sentinel)
        assert method.apply(layer, x) is not None and not calls
        return
    out = method.apply(layer, x)
    assert out.shape == (*lead, 48) and len(calls) == gemv_calls
    ref = _fp8_ref(x.reshape(-1, 64), layer.weight, layer.weight_scale.reshape(-1), layer.bias)
    assert rel_err(out.reshape(-1, 48), ref) < bf16_tol()


def test_fp8_custom_op_fake_matches_the_real_op(monkeypatch):
    import infer_cuda.ops.linear_fp8  # noqa: F401 (registers infer_cuda::gemv_fp8)

    monkeypatch.setenv("INFER_CUDA_GEMV", "force")  # the real op runs the GEMV, not _scaled_mm

    x, w, scale, b = _fp8_inputs(2, 32, 64, bias=True)
    # (test_schema compares fp8 inputs with an op torch's CPU build lacks for fp8)
    torch.library.opcheck(torch.ops.infer_cuda.gemv_fp8.default, (x, w, scale.view(1, -1), b),
                          test_utils=("test_faketensor",))


# -- GPU only ------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (4, 1000, 3000)])
def test_gpu_pick(monkeypatch, M, N, K):
    from infer_cuda.ops.linear_dense import small_m_linear

    monkeypatch.delenv("INFER_CUDA_GEMV", raising=False)
    choice = g.pick(M, N, K, torch.bfloat16, torch.device("cuda"))
    assert choice == "cublas" or choice in g.CONFIGS
    x, w, b = _inputs(M, N, K, torch.bfloat16, bias=True)
    _check(small_m_linear(x, w, b), x, w, b)


@pytest.mark.gpu
@needs_gpu
def test_gpu_split_k_graph_replay():
    """The counters reset themselves: a captured split-K launch stays right on every replay."""
    x, w, b = _inputs(2, 4096, 4096, torch.bfloat16, bias=True)
    config = (32, 256, 4, 8, 2)
    g.gemv(x, w, b, config)  # compile and allocate the counters outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = g.gemv(x, w, b, config)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x, w, b)


def test_prewarm_makes_each_m_bucket_choice_at_load(monkeypatch):
    """On CUDA the dense method times every M bucket (1, 2, 4, 8) of a weight shape when the
    weights load; off CUDA, or with INFER_CUDA_GEMV=off, it times nothing."""
    from infer_cuda.ops import linear_dense

    calls = []
    monkeypatch.setattr(g, "pick", lambda *a: calls.append(a[:5]) or "cublas")
    monkeypatch.setattr(linear_dense, "interpreting", lambda: False)
    monkeypatch.delenv("INFER_CUDA_GEMV", raising=False)
    cuda = torch.device("cuda")
    linear_dense.prewarm_small_m(96, 64, torch.bfloat16, cuda)
    assert calls == [(m, 96, 64, torch.bfloat16, cuda) for m in (1, 2, 4, 8)]
    calls.clear()
    linear_dense.prewarm_small_m(96, 64, torch.bfloat16, torch.device("cpu"))
    linear_dense.prewarm_small_m(96, 64, torch.float32, cuda)  # not a GEMV dtype
    monkeypatch.setenv("INFER_CUDA_GEMV", "off")
    linear_dense.prewarm_small_m(96, 64, torch.bfloat16, cuda)
    assert calls == []
