"""GPU engine benchmark: batch-1 / batch-N decode, TTFT, MoE, each against the measured
bandwidth bound; optional transformers peer on the same shapes.

Runs the real EngineCore (scheduler, model runner, CUDA graphs, sampler) on a config-only model
(--load-format dummy). Prints one JSON line per run and a table at the end.

    python benchmarks/gpu/bench_engine.py --model llama3-8b --batch 1 64 --hf-peer

Dummy weights are drawn on the GPU here: the loader's generator runs on the CPU and would spend
minutes of device time on 8B parameters (same distribution: uniform +-0.02, norms at 1).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

DEVICE = "cuda"  # the platform the engine runs on (a CPU smoke run sets "cpu")

SHAPES = {
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16"),
    # Mixtral-8x7B shapes with 16 of its 32 layers (46 GB of bf16 weights fit an 80 GB H100)
    "mixtral-16l": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
                        intermediate_size=14336, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=8192,
                        num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                        eos_token_id=2, torch_dtype="bfloat16"),
}


def device_dummy_init(self, seed: int = 0) -> None:
    gen = {}
    for name, p in self.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
            continue
        g = gen.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
        p.data.uniform_(-0.02, 0.02, generator=g)


def measure_bandwidth(nbytes: int = 4 * 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / sorted(times)[len(times) // 2]


def step_bytes(cfg: dict, batch: int, ctx_len: float, weight_bytes: int, dtype_bytes: int = 2) -> float:
    """Fewest bytes one decode step must read: the weights it touches plus every sequence's KV."""
    layers, hkv = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = batch * ctx_len * layers * 2 * hkv * head_dim * dtype_bytes
    if "num_local_experts" in cfg:  # only the experts some token picks are read
        e, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
        expert = 3 * cfg["hidden_size"] * cfg["intermediate_size"] * dtype_bytes
        all_experts = layers * e * expert
        used = e * (1 - (1 - k / e) ** batch)  # expected distinct experts per layer, uniform routing
        weight_bytes = weight_bytes - all_experts + layers * used * expert
    return weight_bytes + kv


def replay_ms(core, batch: int) -> float | None:
    """Median GPU time of one captured decode step (graph replay alone, no engine work)."""
    gr = core.runner.graph_runner
    if gr is None or not gr.graphs:
        return None
    bs = gr._size_for(batch)
    if bs is None:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(30):
        start.record()
        gr.graphs[bs].replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def profiled(fn, top: int):
    """Run fn under cProfile and print the top functions by own time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print(buf.getvalue()[-6000:], flush=True)
    return out


def run_engine(model_dir: Path, batch: int, input_len: int, output_len: int, settings: dict,
               profile: bool = False) -> dict:
    from infer.core.config import ServerArgs
    from infer.core.config.gate import apply_platform_defaults
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.models.base import DecoderOnlyLM
    from infer.core.plugins import get_plugin_host

    DecoderOnlyLM.init_dummy_weights = device_dummy_init
    args = ServerArgs(model_path=str(model_dir), load_format="dummy", dtype="bfloat16",
                      device=DEVICE, skip_tokenizer_init=True, random_seed=0, **settings)
    platform = get_plugin_host().select(DEVICE)
    apply_platform_defaults(args, platform)
    t_load = time.perf_counter()
    core = EngineCore(args, platform=platform)
    load_s = time.perf_counter() - t_load
    weight_bytes = sum(p.numel() * p.element_size() for p in core.loaded.model.parameters())
    vocab = core.arch.vocab_size
    g = torch.Generator().manual_seed(0)
    params = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}

    def generate(core, n: int, new: int, tag: str) -> dict:
        p = dict(params, max_new_tokens=new)
        t0 = time.perf_counter()
        for i in range(n):
            ids = torch.randint(10, vocab - 10, (input_len,), generator=g).tolist()
            core.add_request(core.make_request(f"{tag}{i}", ids, p))
        first, got, steps = {}, 0, 0
        while core.has_work():
            outs = core.step()
            steps += 1
            now = time.perf_counter()
            for o in outs:
                if o.new_token_ids and o.rid not in first:
                    first[o.rid] = now
                got += len(o.new_token_ids)
        end = time.perf_counter()
        all_first = max(first.values())
        return dict(tokens=got, ttft_s=min(first.values()) - t0, all_first_s=all_first - t0,
                    decode_s=end - all_first, total_s=end - t0, steps=steps)

    generate(core, batch, 8, "warm")  # Triton compilation for these shapes, allocator warm-up
    r = generate(core, batch, output_len, "run")
    if profile:
        r["replay_ms"] = replay_ms(core, batch)
        profiled(functools.partial(generate, core, batch, 64, "prof"), 25)
    r.update(batch=batch, input_len=input_len, output_len=output_len, load_s=load_s,
             weight_bytes=weight_bytes,
             decode_tok_s=batch * (output_len - 1) / r["decode_s"],
             total_tok_s=r["tokens"] / r["total_s"])
    del core
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return r


def run_transformers(cfg: dict, batch: int, input_len: int, output_len: int) -> dict:
    import transformers as tf

    config = tf.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    config.torch_dtype = torch.bfloat16
    cls = getattr(tf, cfg["architectures"][0])
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = cls(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    ids = torch.randint(10, config.vocab_size - 10, (batch, input_len), device="cuda")
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        torch.cuda.synchronize()
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw)
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return dict(batch=batch, ttft_s=ttft, total_s=total,
                decode_tok_s=batch * (output_len - 1) / max(total - ttft, 1e-9))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--enable-torch-compile", action="store_true")
    ap.add_argument("--disable-overlap-schedule", action="store_true")
    ap.add_argument("--quantization", default=None, help="e.g. fp8 (online, per-channel weights)")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--enable-piecewise-cuda-graph", action="store_true",
                    help="CUDA graphs for single-sequence prefill (TTFT)")
    ap.add_argument("--hf-peer", action="store_true", help="also time transformers' generate")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="also time bare graph replays and cProfile a short run")
    ap.add_argument("--max-total-tokens", type=int, default=None)
    a = ap.parse_args()

    cfg = SHAPES[a.model]
    model_dir = Path(tempfile.mkdtemp(prefix=f"infer-{a.model}-"))
    (model_dir / "config.json").write_text(json.dumps(cfg))
    bw = measure_bandwidth()
    dev = torch.cuda.get_device_name()
    print(json.dumps({"device": dev, "d2d_bandwidth_GBps": bw / 1e9}), flush=True)
    settings = dict(attention_backend=a.attention_backend, disable_cuda_graph=a.disable_cuda_graph,
                    cuda_graph_bs=sorted(set(a.batch)), max_running_requests=max(a.batch),
                    enable_torch_compile=a.enable_torch_compile, torch_compile_max_bs=max(a.batch),
                    chunked_prefill_size=8192, disable_overlap_schedule=a.disable_overlap_schedule,
                    enable_piecewise_cuda_graph=a.enable_piecewise_cuda_graph,
                    quantization=a.quantization, kv_cache_dtype=a.kv_cache_dtype)
    if a.max_total_tokens:
        settings["max_total_tokens"] = a.max_total_tokens
    rows = []
    for b in a.batch:
        r = run_engine(model_dir, b, a.input_len, a.output_len, settings, a.profile)
        ctx = a.input_len + a.output_len / 2
        kv_bytes = 1 if a.kv_cache_dtype.startswith("fp8") else 2
        bound = b / (step_bytes(cfg, b, ctx, r["weight_bytes"], kv_bytes) / bw)
        r.update(model=a.model, engine="infer", backend=a.attention_backend,
                 torch_compile=a.enable_torch_compile, overlap=not a.disable_overlap_schedule,
                 prefill_graphs=a.enable_piecewise_cuda_graph, quantization=a.quantization,
                 kv_cache_dtype=a.kv_cache_dtype,
                 cuda_graph=not a.disable_cuda_graph, bound_tok_s=bound,
                 frac_of_bound=r["decode_tok_s"] / bound)
        print(json.dumps(r), flush=True)
        rows.append(r)
        if a.hf_peer:
            h = run_transformers(cfg, b, a.input_len, a.output_len)
            h.update(model=a.model, engine="transformers", backend="eager", bound_tok_s=bound,
                     frac_of_bound=h["decode_tok_s"] / bound)
            print(json.dumps(h), flush=True)
            rows.append(h)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"device": dev, "bw": bw, "rows": rows}, indent=1))
    print(f"\n{dev}  D2D {bw / 1e9:.0f} GB/s  model {a.model}  in {a.input_len} out {a.output_len}")
    print(f"compile={a.enable_torch_compile} overlap={not a.disable_overlap_schedule} "
          f"prefill_graphs={a.enable_piecewise_cuda_graph} quantization={a.quantization} "
          f"kv_cache_dtype={a.kv_cache_dtype}")
    print(f"{'engine':<13}{'batch':>6}{'decode tok/s':>14}{'bound':>9}{'frac':>7}{'TTFT ms':>9}")
    for r in rows:
        print(f"{r['engine']:<13}{r['batch']:>6}{r['decode_tok_s']:>14.1f}{r['bound_tok_s']:>9.0f}"
              f"{r['frac_of_bound']:>7.2f}{r['ttft_s'] * 1e3:>9.1f}")


if __name__ == "__main__":
    main()
