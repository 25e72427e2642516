"""SGLang's native routes: /generate, health, model and server info, cache, tokenizer, abort.

``/generate`` takes SGLang's body (``text`` or ``input_ids``, ``sampling_params``) and answers
``{"text", "output_ids", "meta_info"}`` (a list for a batch); streamed chunks carry the text so
far, as SGLang's do (with --stream-output, only the new segment). Admin routes (/get_server_info, /flush_cache) take --admin-api-key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from infer.server.auth import require_admin_key, require_api_key
from infer.server.errors import APIError, bad_request, unavailable
from infer.server.generation import SeqDelta, merge
from infer.server.openai_format import SSE_DONE, TokenText, sse
from infer.server.protocol import (
    AbortRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
    openapi_body,
    parse_body,
)
from infer.server.request_limits import read_body
from infer.server.serving import GenerateJob, ServerState, Serving, cancel_on_disconnect, make_params

open_router = APIRouter()
api_router = APIRouter(dependencies=[Depends(require_api_key)])
admin_router = APIRouter(dependencies=[Depends(require_admin_key)])

_SECRET_ARGS = ("api_key", "admin_api_key")


def _state(request: Request) -> ServerState:
    return request.app.state.infer


# -- open --------------------------------------------------------------------------------------
@open_router.get("/health")
async def health(request: Request) -> Response:
    s = _state(request)
    if s.client.dead:
        raise unavailable(f"the engine is not running: {s.client.dead}")
    if s.draining:
        raise unavailable("the server is shutting down")
    return Response(status_code=200)


@open_router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Healthy when the engine produces a token within 20 s."""
    s = _state(request)
    job = GenerateJob([_any_token(s)], make_params({"max_new_tokens": 1, "temperature": 0.0}, {}),
                      rid=f"health-{uuid.uuid4().hex}", route="/health_generate", stream=False)
    serving = Serving(s)
    serving.prepare(job)

    async def one() -> None:
        async for _ in serving.generate(job):
            pass

    try:
        await asyncio.wait_for(one(), 20)
    except asyncio.TimeoutError:
        raise unavailable("the engine did not generate a token within 20 s") from None
    return Response(status_code=200)


@open_router.get("/metrics")
async def metrics(request: Request) -> Response:
    s = _state(request)
    if s.metrics is None:
        raise APIError(404, "metrics are off; start the server with --enable-metrics")
    from prometheus_client import CONTENT_TYPE_LATEST

    return PlainTextResponse(s.metrics.render(s.client.stats), media_type=CONTENT_TYPE_LATEST)


def _any_token(s: ServerState) -> int:
    ids = s.tokenizer.encode("ok", add_special_tokens=False) if s.tokenizer is not None else []
    return ids[0] if ids else 0


# -- API key -----------------------------------------------------------------------------------
@api_router.get("/get_model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    s = _state(request)
    tokenizer_path = getattr(s.args, "tokenizer_path", None) or s.client.ready.model_path
    return {"model_path": s.client.ready.model_path, "tokenizer_path": tokenizer_path,
            "served_model_name": s.model_name, "is_generation": True,
            "context_length": s.context_length, "eos_token_ids": s.client.ready.eos_token_ids,
            "has_chat_template": s.chat_template is not None}


@api_router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize(request: Request) -> dict[str, Any]:
    s = _state(request)
    body = parse_body(TokenizeRequest, await read_body(request))
    s.need_tokenizer("/tokenize")
    prompt = body.prompt if body.prompt is not None else body.text
    if prompt is None:
        raise bad_request("send 'prompt' (a string or a list of strings)", param="prompt")
    texts = prompt if isinstance(prompt, list) else [prompt]
    encoded = await asyncio.to_thread(  # off the event loop: the body limit bounds its length
        lambda: [s.tokenizer.encode(p, add_special_tokens=body.add_special_tokens) for p in texts])
    tokens: Any = encoded if isinstance(prompt, list) else encoded[0]
    count: Any = [len(t) for t in encoded] if isinstance(prompt, list) else len(encoded[0])
    return {"tokens": tokens, "count": count, "max_model_len": s.context_length}


@api_router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(request: Request) -> dict[str, Any]:
    s = _state(request)
    body = parse_body(DetokenizeRequest, await read_body(request))
    s.need_tokenizer("/detokenize")
    ids = body.tokens if body.tokens is not None else body.input_ids
    if ids is None:
        raise bad_request("send 'tokens' (a list of token ids)", param="tokens")
    vocab = len(s.tokenizer)
    bad = [t for t in ids if t >= vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary (size {vocab})", param="tokens")
    return {"text": s.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)}


@api_router.post("/abort_request", openapi_extra=openapi_body(AbortRequest))
async def abort_request(request: Request) -> dict[str, Any]:
    s = _state(request)
    body = parse_body(AbortRequest, await read_body(request))
    if body.abort_all:
        await s.client.abort(None)
        return {"aborted": "all"}
    if not body.rid:
        raise bad_request("send 'rid' (the request id) or 'abort_all': true", param="rid")
    rids = s.client.rids_of(body.rid)
    if not rids:
        raise APIError(404, f"no running request has rid {body.rid!r}", param="rid")
    for rid in rids:
        await s.client.abort(rid)
    return {"aborted": rids}


@api_router.post("/generate", openapi_extra=openapi_body(GenerateRequest))
async def generate(request: Request) -> Response:
    s = _state(request)
    body = parse_body(GenerateRequest, await read_body(request))
    jobs = await _generate_jobs(s, body)
    serving = Serving(s)
    for job in jobs:
        serving.prepare(job)
    batch = isinstance(body.text, list) or (isinstance(body.input_ids, list) and body.input_ids
                                            and isinstance(body.input_ids[0], list))
    async def numbered(j: int, job: GenerateJob) -> AsyncIterator[tuple[int, SeqDelta]]:
        async for d in serving.generate(job):
            yield j, d

    guarded = cancel_on_disconnect(request, merge([numbered(j, job) for j, job in enumerate(jobs)]))
    first = await anext(guarded, None)
    if first is None:
        return Response(status_code=499)
    fmt = _GenerateFormat(s, jobs, time.monotonic())

    async def chain() -> AsyncIterator[tuple[int, SeqDelta]]:
        yield first
        async for item in guarded:
            yield item

    if body.stream:
        segments = bool(getattr(s.args, "stream_output", False))  # --stream-output: disjoint chunks

        async def events() -> AsyncIterator[str]:
            try:
                async for j, d in chain():
                    fmt.add(j, d)
                    ids_only = segments or s.tokenizer is None
                    if d.text or d.finish_reason is not None or (ids_only and d.token_ids):
                        out = fmt.segment(j, d) if segments else fmt.result(j)
                        if batch:
                            out["index"] = j
                        yield sse(out)
            except APIError as err:
                yield sse(err.body())
            yield SSE_DONE

        return StreamingResponse(events(), media_type="text/event-stream")
    async for j, d in chain():
        fmt.add(j, d)
    results = [fmt.result(j) for j in range(len(jobs))]
    return JSONResponse(results if batch else results[0])


async def _generate_jobs(s: ServerState, body: GenerateRequest) -> list[GenerateJob]:
    if (body.text is None) == (body.input_ids is None):
        raise bad_request("send exactly one of 'text' and 'input_ids'", param="text")
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        s.need_tokenizer("'text'")
        prompts = list(zip(await s.prompts.encode(texts, param="text"), texts, strict=True))
    else:
        ids = body.input_ids or []
        batch = ids if (ids and isinstance(ids[0], list)) else [ids]
        prompts = [(list(p), None) for p in batch]
    sps = body.sampling_params if isinstance(body.sampling_params, list) else \
        [body.sampling_params] * len(prompts)
    rids = body.rid if isinstance(body.rid, list) else \
        [body.rid if len(prompts) == 1 and body.rid else None] * len(prompts)
    if len(sps) != len(prompts) or len(rids) != len(prompts):
        raise bad_request("sampling_params and rid lists must be as long as the batch", param="sampling_params")
    jobs = []
    for (ids, text), sp, rid in zip(prompts, sps, rids, strict=False):
        params = make_params(dict(sp or {}), s.sampling_defaults)
        if params.n != 1:
            raise bad_request("sampling_params.n other than 1 is not supported by /generate; send "
                              "the prompt several times", param="n")
        job = GenerateJob(ids, params, return_logprob=body.return_logprob,
                          top_logprobs_num=body.top_logprobs_num,
                          logprob_start_len=body.logprob_start_len, route="/generate", prompt_text=text,
                          stream=bool(body.stream))
        if rid:
            job.rid = rid
        jobs.append(job)
    return jobs


class _GenerateFormat:
    def __init__(self, s: ServerState, jobs: list[GenerateJob], started: float) -> None:
        self.s, self.jobs, self.started = s, jobs, started
        self.tt = TokenText(s.tokenizer)
        self.text = [""] * len(jobs)
        self.ids: list[list[int]] = [[] for _ in jobs]
        self.lps: list[list] = [[] for _ in jobs]
        self.prompt_lps: list[Any] = [None] * len(jobs)
        self.last: list[SeqDelta | None] = [None] * len(jobs)

    def add(self, j: int, d: SeqDelta) -> None:
        self.text[j] += d.text
        self.ids[j] += d.token_ids
        self.lps[j] += d.logprobs
        if d.prompt_logprobs is not None:
            self.prompt_lps[j] = d.prompt_logprobs
        self.last[j] = d

    def result(self, j: int) -> dict[str, Any]:
        d, job = self.last[j], self.jobs[j]
        reason: dict[str, Any] | None = None
        if d is not None and d.finish_reason is not None:
            reason = {"type": d.finish_reason}
            if d.finish_reason == "length":
                reason["length"] = d.completion_tokens
            elif d.matched_stop is not None:
                reason["matched"] = d.matched_stop
        meta: dict[str, Any] = {
            "id": job.rid, "finish_reason": reason, "prompt_tokens": len(job.prompt_ids),
            "completion_tokens": d.completion_tokens if d else 0,
            "cached_tokens": d.cached_tokens if d else 0,
            "e2e_latency": time.monotonic() - self.started}
        if job.return_logprob:
            meta["output_token_logprobs"] = [(lp.logprob, lp.token_id, None) for lp in self.lps[j]]
            meta["output_top_logprobs"] = [[(v, i, None) for i, v in lp.top] for lp in self.lps[j]]
            if self.prompt_lps[j] is not None:
                meta["input_token_logprobs"] = [(lp.logprob, lp.token_id, None) for lp in self.prompt_lps[j]]
        if self.s.tokenizer is None:  # --skip-tokenizer-init: ids only, as SGLang answers
            return {"output_ids": list(self.ids[j]), "meta_info": meta}
        return {"text": self.text[j], "output_ids": list(self.ids[j]), "meta_info": meta}

    def segment(self, j: int, d: SeqDelta) -> dict[str, Any]:
        """--stream-output: only what ``d`` adds (text, ids), with the meta so far (SGLang's
        disjoint segments; the default stream repeats everything so far)."""
        out = self.result(j)
        out["output_ids"] = list(d.token_ids)
        if "text" in out:
            out["text"] = d.text
        return out


# -- admin -------------------------------------------------------------------------------------
@admin_router.get("/get_server_info")
async def get_server_info(request: Request) -> dict[str, Any]:
    s = _state(request)
    stats = await s.client.call("stats")
    args = s.args.model_dump() if hasattr(s.args, "model_dump") else dict(vars(s.args))
    for key in _SECRET_ARGS:
        if args.get(key):
            args[key] = "***"
    try:
        version = importlib.metadata.version("infer-core")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {**_jsonable(args), "version": version, "served_model_name": s.model_name,
            "context_length": s.context_length, "engine": stats, "internal_states": [stats],
            "draining": s.draining, "in_flight_requests": s.in_flight}


@admin_router.post("/flush_cache")
async def flush_cache(request: Request) -> Response:
    s = _state(request)
    ok = await s.client.call("flush_cache")
    if ok is False:
        raise bad_request("the prefix cache was not flushed: requests are running; retry when idle")
    return PlainTextResponse("Cache flushed.\n")


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = dataclasses.asdict(v)
        out[k] = v if isinstance(v, (str, int, float, bool, list, dict, type(None))) else str(v)
    return out
