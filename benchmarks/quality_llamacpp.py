"""Peer quality: llama.cpp (llama-cpp-python) on the same GGUF, the same pydoc_data windows and
token ids as ``infer bench quality``: perplexity, and KL divergence and top-1 agreement against
infer's float32 reference of the same weights (computed here too). Prints one JSON line per row.

    python benchmarks/quality_llamacpp.py --model smollm2 --windows 8 --window-len 256
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch


def llamacpp_logprobs(model_path: str, ids: list[int], threads: int) -> torch.Tensor:
    """log-probabilities [len(ids), V] of llama.cpp's next-token distribution at each position
    (one prompt evaluation, as its perplexity tool does)."""
    from llama_cpp import Llama

    llm = llamacpp_logprobs.cache.get(model_path)  # type: ignore[attr-defined]
    if llm is None or llm.n_ctx() < len(ids):
        llm = Llama(model_path=model_path, n_ctx=len(ids), n_batch=len(ids), logits_all=True,
                    n_threads=threads, n_threads_batch=threads, verbose=False)
        llamacpp_logprobs.cache[model_path] = llm  # type: ignore[attr-defined]
    llm.reset()
    llm.eval(ids)
    scores = torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))
    return torch.log_softmax(scores, dim=-1)


llamacpp_logprobs.cache = {}  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from infer.cli.bench_metrics import quality_metrics
    from infer.cli.bench_quality import quality_windows, reference_core, reference_logprobs
    from infer.core.config import ServerArgs
    from infer.core.model.loader.default_model import resolve_alias

    path = resolve_alias(args.model)
    core = reference_core(ServerArgs(model_path=path))
    wins = quality_windows(core.tokenizer, args.windows, args.window_len)
    ref = reference_logprobs(core, wins)  # [W, L - 1, V]
    del core
    nll, kl, agree = [], [], []
    for w, ids in enumerate(wins):
        lp = llamacpp_logprobs(path, ids, args.threads)[:-1]  # positions 0 .. L - 2
        tgt = torch.tensor(ids[1:])
        nll += (-lp.gather(1, tgt[:, None])[:, 0]).tolist()
        kl += (ref[w].exp() * (ref[w] - lp)).sum(-1).clamp(min=0).tolist()
        agree += (ref[w].argmax(-1) == lp.argmax(-1)).tolist()
    import llama_cpp

    print(json.dumps({"path": "llama.cpp", "engine_version": llama_cpp.__version__,
                      "mode": "prefill", "windows": len(wins), "window_len": args.window_len,
                      **quality_metrics(nll, kl, agree)}), flush=True)


if __name__ == "__main__":
    main()
