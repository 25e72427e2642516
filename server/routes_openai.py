"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models.

Each route validates the body (400 naming the field), builds one ``GenerateJob`` per prompt, and
waits for the first delta before answering, so a refusal (full queue, dead engine) is a real HTTP
status rather than an error inside a stream. Streams end with exactly one finish_reason per
choice, an optional usage chunk, then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from infer.server.auth import require_api_key
from infer.server.chat import render_chat
from infer.server.chat_output import ChoiceAssembler, tool_calls_json
from infer.server.errors import APIError, bad_request
from infer.server.generation import SeqDelta, merge
from infer.server.openai_format import (
    SSE_DONE,
    TokenText,
    chat_logprobs,
    completion_logprobs,
    sampling_fields,
    sse,
    usage,
)
from infer.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    openapi_body,
    parse_body,
)
from infer.server.reasoning import ReasoningSplitter
from infer.server.request_limits import read_body
from infer.server.serving import GenerateJob, Guarded, ServerState, Serving, make_params
from infer.server.tool_parsers import forced_grammar, forced_schema, get_parser

router = APIRouter(dependencies=[Depends(require_api_key)])


def _state(request: Request) -> ServerState:
    return request.app.state.infer


def check_model(s: ServerState, model: str | None) -> None:
    if model and model not in (s.model_name, s.client.ready.model_path):
        raise APIError(404, f"the model {model!r} does not exist; this server serves {s.model_name!r}",
                       param="model", code="model_not_found")


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    s = _state(request)
    return {"object": "list", "data": [{"id": s.model_name, "object": "model", "created": int(s.started),
                                        "owned_by": "infer", "root": s.client.ready.model_path,
                                        "max_model_len": s.context_length}]}


async def _start(request: Request, s: ServerState, jobs: list[GenerateJob]
                 ) -> tuple[SeqDelta | None, Guarded]:
    """Run the jobs (choice index = job * n + sequence); return the first delta and the rest,
    whose owner closes it (``_respond`` does)."""
    serving = Serving(s)
    for job in jobs:
        serving.prepare(job)

    async def renumber(j: int, job: GenerateJob) -> AsyncIterator[SeqDelta]:
        async for d in serving.generate(job):
            yield dataclasses.replace(d, index=j * job.n + d.index)

    # the first job's indices stand as they are: its deltas pass through one generator less
    merged = merge([renumber(j, job) if j else serving.generate(job) for j, job in enumerate(jobs)])
    guarded = Guarded(request, merged)
    try:
        first = await anext(guarded, None)
    except BaseException:
        guarded.close()
        raise
    if first is None:
        guarded.close()
    return first, guarded


class _Format(Protocol):
    def add(self, d: SeqDelta) -> None: ...
    def event(self, d: SeqDelta) -> list[str]: ...
    def tail(self) -> list[str]: ...
    def response(self) -> dict[str, Any]: ...


async def _respond(stream: bool, first: SeqDelta, rest: Guarded, fmt: _Format) -> Response:
    """The route's answer from its first delta on: an event stream, or the whole JSON body."""
    if stream:
        return _EventStream(first, rest, fmt)
    try:
        fmt.add(first)

        async def add(d: SeqDelta) -> None:
            fmt.add(d)

        await rest.pump(add)  # a client gone: the choices still running end as "abort"
    finally:
        rest.close()
    return JSONResponse(fmt.response())


async def _no_body() -> AsyncIterator[str]:
    return
    yield  # an async generator: _EventStream writes its events itself


class _EventStream(StreamingResponse):
    """text/event-stream of ``fmt``'s events, then ``[DONE]``: the first delta's by the route's
    task, every later one by the producer task of ``rest`` as the delta arrives (``pump``), so a
    streamed token costs one task switch. A failure after the first delta becomes an error
    event (the status is sent already)."""

    def __init__(self, first: SeqDelta, rest: Guarded, fmt: _Format) -> None:
        super().__init__(_no_body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.first, self.rest, self.fmt = first, rest, fmt

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def write(events: list[str], more: bool = True) -> None:
            for e in events:
                await send({"type": "http.response.body", "body": e.encode(), "more_body": more})

        async def emit(d: SeqDelta) -> None:
            await write(self.fmt.event(d))

        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            try:
                await emit(self.first)
                if not await self.rest.pump(emit):
                    return  # the client went away
                await write(self.fmt.tail())
            except APIError as err:
                await write([sse(err.body())])
            await write([SSE_DONE], more=False)
        finally:
            self.rest.close()


# -- /v1/completions ---------------------------------------------------------------------------
@router.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
async def completions(request: Request) -> Response:
    s = _state(request)
    body = parse_body(CompletionRequest, await read_body(request))
    check_model(s, body.model)
    if body.suffix:
        raise bad_request("suffix is not supported by infer; remove it", param="suffix")
    if body.best_of not in (None, body.n):
        raise bad_request("best_of other than n is not supported by infer", param="best_of")
    s.need_tokenizer("/v1/completions")
    prompts = await _prompts(body.prompt, s)
    params = make_params(sampling_fields(body, body.max_tokens), s.sampling_defaults)
    want_lp = body.logprobs is not None
    jobs = [GenerateJob(ids, dataclasses.replace(params, stop=list(params.stop)), n=body.n,
                        return_logprob=want_lp, top_logprobs_num=body.logprobs or 0,
                        logprob_start_len=0 if (want_lp and body.echo) else -1,
                        route="/v1/completions", prompt_text=text, user=body.user,
                        stream=bool(body.stream))
            for ids, text in prompts]
    first, rest = await _start(request, s, jobs)
    if first is None:
        return Response(status_code=499)  # the client went away before the first token
    return await _respond(bool(body.stream), first, rest,
                          _CompletionFormat(s, body, jobs, f"cmpl-{uuid.uuid4().hex}"))


async def _prompts(prompt: Any, s: ServerState) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt; long texts are tokenised (``PromptEncoder``) and id
    prompts detokenised off the event loop."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt is empty", param="prompt")
    if isinstance(prompt[0], str):
        return list(zip(await s.prompts.encode(prompt), prompt, strict=True))
    batch = [list(prompt)] if isinstance(prompt[0], int) else [list(p) for p in prompt]
    texts = await asyncio.to_thread(lambda: [s.tokenizer.decode(ids) for ids in batch])
    return list(zip(batch, texts, strict=True))


class _CompletionFormat:
    def __init__(self, s: ServerState, body: CompletionRequest, jobs: list[GenerateJob], rid: str) -> None:
        self.s, self.body, self.jobs, self.rid = s, body, jobs, rid
        self.created = int(time.time())
        self.tt = TokenText(s.tokenizer)
        n = len(jobs) * body.n
        self.text = [""] * n
        self.lps: list[list] = [[] for _ in range(n)]
        self.offset = [0] * n
        self.started = [False] * n
        self.finals: dict[int, SeqDelta] = {}

    def _job(self, index: int) -> GenerateJob:
        return self.jobs[index // self.body.n]

    def _piece(self, d: SeqDelta) -> tuple[str, list]:
        text, lps = d.text, list(d.logprobs)
        if not self.started[d.index]:
            self.started[d.index] = True
            if self.body.echo:
                text = (self._job(d.index).prompt_text or "") + text
                lps = list(d.prompt_logprobs or []) + lps
        return text, lps

    def add(self, d: SeqDelta) -> None:
        text, lps = self._piece(d)
        self.text[d.index] += text
        self.lps[d.index] += lps
        if d.finish_reason is not None:
            self.finals[d.index] = d

    def _usage(self) -> dict[str, Any]:
        finals = list(self.finals.values())
        prompt = sum(len(j.prompt_ids) for j in self.jobs)
        cached = sum(d.cached_tokens for d in finals if d.index % self.body.n == 0)
        return usage(prompt, finals, cached)

    def response(self) -> dict[str, Any]:
        choices = []
        for i, text in enumerate(self.text):
            lp = completion_logprobs(self.lps[i], self.tt, 0) if self.body.logprobs is not None else None
            choices.append({"index": i, "text": text, "logprobs": lp,
                            "finish_reason": self.finals[i].finish_reason if i in self.finals else "abort",
                            "matched_stop": self.finals[i].matched_stop if i in self.finals else None})
        return {"id": self.rid, "object": "text_completion", "created": self.created,
                "model": self.s.model_name, "choices": choices, "usage": self._usage()}

    def event(self, d: SeqDelta) -> list[str]:
        """The stream's chunk for delta d (none for an empty delta)."""
        text, lps = self._piece(d)
        if d.finish_reason is not None:
            self.finals[d.index] = d
        if not text and d.finish_reason is None and not (lps and self.body.logprobs is not None):
            return []
        lp = None
        if self.body.logprobs is not None:
            lp = completion_logprobs(lps, self.tt, self.offset[d.index])
        self.offset[d.index] += len(text)
        return [sse({"id": self.rid, "object": "text_completion", "created": self.created,
                     "model": self.s.model_name,
                     "choices": [{"index": d.index, "text": text, "logprobs": lp,
                                  "finish_reason": d.finish_reason}]})]

    def tail(self) -> list[str]:
        """After the last delta: the usage chunk, if the request asked for it."""
        if self.body.stream_options and self.body.stream_options.include_usage:
            return [sse({"id": self.rid, "object": "text_completion", "created": self.created,
                         "model": self.s.model_name, "choices": [], "usage": self._usage()})]
        return []


# -- /v1/chat/completions ----------------------------------------------------------------------
@router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    s = _state(request)
    body = parse_body(ChatCompletionRequest, await read_body(request))
    check_model(s, body.model)
    s.need_tokenizer("/v1/chat/completions")
    tools_on = bool(body.tools) and body.tool_choice != "none"
    forced = forced_schema(body) if tools_on else None
    if body.tool_choice not in (None, "none") and not body.tools:
        raise bad_request("tool_choice needs tools", param="tool_choice")
    if isinstance(body.tool_choice, NamedToolChoice) and forced is None:
        raise bad_request(f"tool_choice names the function {body.tool_choice.function.name!r}, "
                          "which is not in tools", param="tool_choice")
    if tools_on and forced is None and not s.tool_call_parser:
        raise bad_request("tool_choice 'auto' needs a tool-call parser, and this model's chat template "
                          "does not say which format it calls tools in: start the server with "
                          "--tool-call-parser (hermes, qwen25 or llama3), or use tool_choice 'required' "
                          "or a named function", param="tool_choice")
    prompt = render_chat(s.tokenizer, s.chat_template, body, with_tools=tools_on)
    ids = (await s.prompts.encode([prompt], add_special_tokens=False, param="messages"))[0]
    max_new = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    fields = sampling_fields(body, max_new)
    if forced is not None:
        if fields["json_schema"] or fields["regex"] or fields["ebnf"]:
            raise bad_request("a forced tool_choice cannot be combined with response_format, regex "
                              "or ebnf", param="tool_choice")
        fields["ebnf"] = forced_grammar(forced)
    params = make_params(fields, s.sampling_defaults)
    job = GenerateJob(ids, params, n=body.n, return_logprob=body.logprobs,
                      top_logprobs_num=body.top_logprobs or 0, route="/v1/chat/completions",
                      prompt_text=prompt, user=body.user, stream=bool(body.stream))
    first, rest = await _start(request, s, [job])
    if first is None:
        return Response(status_code=499)
    return await _respond(bool(body.stream), first, rest,
                          _ChatFormat(s, body, job, f"chatcmpl-{uuid.uuid4().hex}", tools_on,
                                      forced is not None))


class _ChatFormat:
    def __init__(self, s: ServerState, body: ChatCompletionRequest, job: GenerateJob, rid: str,
                 tools_on: bool, forced: bool) -> None:
        self.s, self.body, self.job, self.rid = s, body, job, rid
        self.created = int(time.time())
        self.tt = TokenText(s.tokenizer)
        reasoning = getattr(s.args, "reasoning_parser", None) if body.separate_reasoning else None
        thinking = bool((body.chat_template_kwargs or {}).get("enable_thinking", True))
        parser_name = s.tool_call_parser
        self.asm = [ChoiceAssembler(ReasoningSplitter(reasoning, thinking) if reasoning else None,
                                    get_parser(parser_name) if (tools_on and parser_name) else None,
                                    forced) for _ in range(body.n)]
        self.has_reasoning = reasoning is not None
        self.content = [""] * body.n
        self.reasoning = [""] * body.n
        self.calls: list[list] = [[] for _ in range(body.n)]
        self.lps: list[list] = [[] for _ in range(body.n)]
        self.finals: dict[int, SeqDelta] = {}
        self.started = [False] * body.n

    def _reason(self, i: int, d: SeqDelta) -> str | None:
        if d.finish_reason is None:
            return None
        return "tool_calls" if self.calls[i] and d.finish_reason == "stop" else d.finish_reason

    def add(self, d: SeqDelta) -> None:
        piece = self.asm[d.index].feed(d.text, d.finish_reason is not None)
        self.content[d.index] += piece.content
        self.reasoning[d.index] += piece.reasoning
        self.calls[d.index] += piece.tool_calls
        self.lps[d.index] += d.logprobs
        if d.finish_reason is not None:
            self.finals[d.index] = d

    def _usage(self) -> dict[str, Any]:
        finals = list(self.finals.values())
        return usage(len(self.job.prompt_ids), finals, max((d.cached_tokens for d in finals), default=0))

    def response(self) -> dict[str, Any]:
        choices = []
        for i in range(self.body.n):
            msg: dict[str, Any] = {"role": "assistant",
                                   "content": self.content[i] if (self.content[i] or not self.calls[i]) else None}
            if self.has_reasoning:
                msg["reasoning_content"] = self.reasoning[i] or None
            if self.calls[i]:
                msg["tool_calls"] = tool_calls_json(self.calls[i], with_index=False)
            d = self.finals.get(i)
            lp = chat_logprobs(self.lps[i], self.tt, self.body.top_logprobs or 0) if self.body.logprobs else None
            choices.append({"index": i, "message": msg, "logprobs": lp,
                            "finish_reason": self._reason(i, d) if d else "abort",
                            "matched_stop": d.matched_stop if d else None})
        return {"id": self.rid, "object": "chat.completion", "created": self.created,
                "model": self.s.model_name, "choices": choices, "usage": self._usage()}

    def _chunk(self, index: int, delta: dict[str, Any], logprobs: Any = None,
               finish: str | None = None) -> str:
        return sse({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.s.model_name,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                 "finish_reason": finish}]})

    def event(self, d: SeqDelta) -> list[str]:
        """The stream's chunks for delta d: the role first for a choice's first delta."""
        i, out = d.index, []
        if not self.started[i]:
            self.started[i] = True
            out.append(self._chunk(i, {"role": "assistant", "content": ""}))
        piece = self.asm[i].feed(d.text, d.finish_reason is not None)
        self.calls[i] += piece.tool_calls
        if d.finish_reason is not None:
            self.finals[i] = d
        delta: dict[str, Any] = {}
        if piece.reasoning:
            delta["reasoning_content"] = piece.reasoning
        if piece.content:
            delta["content"] = piece.content
        if piece.tool_calls:
            delta["tool_calls"] = tool_calls_json(piece.tool_calls, with_index=True)
        lp = None
        if self.body.logprobs and d.logprobs:
            lp = chat_logprobs(d.logprobs, self.tt, self.body.top_logprobs or 0)
        if delta or lp or d.finish_reason is not None:
            out.append(self._chunk(i, delta, lp, self._reason(i, d)))
        return out

    def tail(self) -> list[str]:
        """After the last delta: the usage chunk, if the request asked for it."""
        if self.body.stream_options and self.body.stream_options.include_usage:
            return [sse({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                         "model": self.s.model_name, "choices": [], "usage": self._usage()})]
        return []
