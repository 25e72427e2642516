"""Peer: llama.cpp through llama-cpp-python on the same GGUF file, batch 1 (one sequence),
same threads and lengths. Prints one JSON line with the keys of infer's one-batch results.

    python benchmarks/peer_llamacpp.py --model smollm2
"""

from __future__ import annotations

import argparse
import json
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from infer.core.model.loader.default_model import resolve_alias
    from llama_cpp import Llama

    llm = Llama(model_path=resolve_alias(args.model), n_ctx=1024, n_batch=512,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    rng = random.Random(0)
    vocab = llm.n_vocab()

    def run(n_in: int, n_out: int) -> tuple[float, float]:
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None  # noqa: SLF001
        prompt = [rng.randrange(100, vocab - 100) for _ in range(n_in)]
        t = time.perf_counter()
        llm.eval(prompt)
        tok = int(llm.sample(temp=0.0))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n_out - 1):
            llm.eval([tok])
            tok = int(llm.sample(temp=0.0))
        return prefill, time.perf_counter() - t

    run(16, 4)  # warm-up
    prefill, decode = run(args.input_len, args.output_len)
    print(json.dumps({"engine": "llama.cpp", "batch_size": 1, "input_len": args.input_len,
                      "output_len": args.output_len, "prefill_latency_s": prefill,
                      "decode_throughput": (args.output_len - 1) / decode,
                      "threads": args.threads}), flush=True)


if __name__ == "__main__":
    main()
