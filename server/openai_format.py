"""OpenAI response shapes: logprobs of each endpoint, usage, SSE framing, sampling fields.

Completions logprobs are the legacy shape (``tokens``, ``token_logprobs``, ``top_logprobs`` as
``{token: logprob}``, ``text_offset``); chat logprobs are ``{"content": [{token, logprob, bytes,
top_logprobs}]}``. Usage counts the prompt once per prompt and every choice's completion tokens.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from infer.server.errors import bad_request
from infer.server.generation import SeqDelta, TokenLogprob
from infer.server.protocol import SamplingExtras


def sampling_fields(body: SamplingExtras, max_new_tokens: int | None) -> dict[str, Any]:
    """The SamplingParams fields of an OpenAI request (None: use the default)."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    fields: dict[str, Any] = {
        "max_new_tokens": max_new_tokens, "min_new_tokens": body.min_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "min_p": body.min_p, "repetition_penalty": body.repetition_penalty,
        "frequency_penalty": body.frequency_penalty, "presence_penalty": body.presence_penalty,
        "stop": stop, "stop_token_ids": body.stop_token_ids, "ignore_eos": body.ignore_eos,
        "skip_special_tokens": body.skip_special_tokens, "no_stop_trim": body.no_stop_trim,
        "seed": body.seed, "regex": body.regex, "ebnf": body.ebnf, "json_schema": body.json_schema,
        "logit_bias": body.logit_bias or None,
    }
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        if fields["json_schema"] or fields["regex"] or fields["ebnf"]:
            raise bad_request("response_format cannot be combined with regex, ebnf or json_schema",
                              param="response_format")
        if fmt.type == "json_object":
            fields["json_schema"] = json.dumps({"type": "object"})
        else:
            spec = fmt.json_schema or {}
            schema = spec.get("schema", spec.get("schema_"))
            if not isinstance(schema, dict):
                raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                                  param="response_format")
            fields["json_schema"] = json.dumps(schema)
    return fields


def usage(prompt_tokens: int, finals: list[SeqDelta], cached: int) -> dict[str, Any]:
    completion = sum(d.completion_tokens for d in finals)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


_JSON = msgspec.json.Encoder()


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event carrying ``obj`` as JSON (UTF-8, compact; msgspec: a tenth of
    json.dumps's time, which was 6 us of each streamed token's chunk)."""
    return "data: " + _JSON.encode(obj).decode() + "\n\n"


SSE_DONE = "data: [DONE]\n\n"


class TokenText:
    """Token id -> the text OpenAI shows for it (cached; tokenizers decode single ids slowly)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.cache[token_id] = self.tok.decode([token_id])
        return text


def completion_logprobs(lps: list[TokenLogprob], token_text: TokenText, offset: int) -> dict[str, Any]:
    """Legacy completions shape; ``offset`` is the text position of the first token."""
    res: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in lps:
        text = token_text(lp.token_id)
        res["tokens"].append(text)
        res["token_logprobs"].append(lp.logprob)
        # the first prompt token has no logprob and no alternatives
        res["top_logprobs"].append(None if lp.logprob is None else {token_text(i): v for i, v in lp.top})
        res["text_offset"].append(offset)
        offset += len(text)
    return res


def chat_logprobs(lps: list[TokenLogprob], token_text: TokenText, top_n: int) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(lp.token_id, lp.logprob),
                         "top_logprobs": [entry(i, v) for i, v in lp.top[:top_n]]} for lp in lps]}
