"""Baseline server for the serving comparison: transformers ``generate`` behind a minimal
OpenAI-compatible ``/v1/completions`` (streaming), one request at a time (the simplest honest
way to serve with transformers). Only for benchmarks.

    python benchmarks/hf_server.py --model smollm2 --dtype bfloat16 --port 30001
"""

import argparse
import asyncio
import json
import threading
import time

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def build_app(model, tokenizer, name: str):
    from transformers import TextIteratorStreamer

    app = FastAPI()
    lock = asyncio.Lock()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompt, max_tokens = body.get("prompt"), int(body.get("max_tokens") or 16)
        if not isinstance(prompt, str) or max_tokens < 1:
            return JSONResponse({"error": {"message": "prompt must be a string, max_tokens >= 1",
                                           "type": "invalid_request_error"}}, status_code=400)
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        min_tokens = max_tokens if body.get("ignore_eos") else 0

        async def stream():
            async with lock:  # one generation at a time
                streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
                kw = {"max_new_tokens": max_tokens, "min_new_tokens": min_tokens, "do_sample": False,
                      "streamer": streamer, "pad_token_id": tokenizer.eos_token_id or 0,
                      "attention_mask": torch.ones_like(ids)}
                th = threading.Thread(target=lambda: model.generate(ids, **kw), daemon=True)
                th.start()
                it = iter(streamer)
                while True:
                    piece = await asyncio.to_thread(next, it, None)
                    if piece is None:
                        break
                    if piece:
                        chunk = {"id": "hf", "object": "text_completion", "created": int(time.time()),
                                 "model": name, "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.to_thread(th.join)
            usage = {"prompt_tokens": ids.shape[1], "completion_tokens": max_tokens if min_tokens else None,
                     "total_tokens": None}
            yield f"data: {json.dumps({'choices': [], 'usage': usage if min_tokens else None})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--port", type=int, default=30001)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import uvicorn
    from infer.cli.bench_data import load_tokenizer
    from peer_transformers import load

    model = load(args.model, args.dtype)
    uvicorn.run(build_app(model, load_tokenizer(args.model), "hf-" + args.model), host="127.0.0.1",
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
