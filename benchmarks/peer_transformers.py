"""Peer: Hugging Face transformers ``generate`` on the same SmolLM2 GGUF (dequantised by
transformers), same threads and lengths as ``infer bench one-batch``. Prints one JSON line per
batch size with the keys of infer's one-batch results.

    python benchmarks/peer_transformers.py --model smollm2 --dtype bfloat16 --batch-size 1 32
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def load(model: str, dtype: str):
    from infer.core.model.loader.default_model import resolve_alias
    from transformers import AutoModelForCausalLM

    path = resolve_alias(model)
    kw = {"dtype": getattr(torch, dtype)}
    if path.endswith(".gguf"):
        import os

        m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path), **kw)
    else:
        m = AutoModelForCausalLM.from_pretrained(path, **kw)
    return m.eval()


@torch.inference_mode()
def one_batch(model, batch_size: int, input_len: int, output_len: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, model.config.vocab_size - 100, (batch_size, input_len), generator=g)
    mask = torch.ones_like(ids)
    kw = {"attention_mask": mask, "do_sample": False, "pad_token_id": 0}
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw)
    total = time.perf_counter() - t
    assert out.shape[1] == input_len + output_len
    decode = max(total - prefill, 1e-9)
    return {"batch_size": batch_size, "input_len": input_len, "output_len": output_len,
            "prefill_latency_s": prefill, "decode_throughput": batch_size * (output_len - 1) / decode,
            "total_latency_s": total}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load(args.model, args.dtype)
    one_batch(model, 1, 16, 4, seed=99)  # warm-up
    for i, bs in enumerate(args.batch_size):
        r = one_batch(model, bs, args.input_len, args.output_len, seed=i)
        r.update({"engine": f"transformers-{args.dtype}", "threads": args.threads})
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
