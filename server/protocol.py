"""Request bodies of the OpenAI-compatible and native routes, validated strictly.

Bodies are parsed with ``model_validate_json(strict=True)``: malformed JSON, a wrong type
(``"max_tokens": "ten"``) and an out-of-range value (``"n": -1``) are all a ``ValidationError``
that ``parse_body`` turns into a 400 naming the offending field. Unknown fields are ignored, as
the OpenAI API does; fields infer knows but does not implement are refused by the routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from infer.server.errors import APIError, bad_request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

_MAX_TOKENS_CAP = 1 << 20  # larger is absurd; the context check gives the real limit
_MAX_N = 128
_MAX_LOGPROBS = 20

NonNegInt = Annotated[int, Field(ge=0, le=_MAX_TOKENS_CAP)]
PosInt = Annotated[int, Field(ge=1, le=_MAX_TOKENS_CAP)]
TokenIds = list[Annotated[int, Field(ge=0, lt=1 << 31)]]  # ids past the vocabulary: the engine's 400


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingExtras(_Strict):
    """Sampling fields shared by both OpenAI endpoints, OpenAI's and SGLang's extras."""

    model: str | None = None
    n: int = Field(1, ge=1, le=_MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=1 << 20)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 63)  # a 64-bit signed integer
    stop: str | list[str] | None = None
    stop_token_ids: TokenIds | None = None
    ignore_eos: bool = False
    min_tokens: NonNegInt = 0
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    rid: str | None = None


class CompletionRequest(SamplingExtras):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: NonNegInt | None = 16
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=_MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=_MAX_N)
    suffix: str | None = None


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(_Strict):
    class _Fn(_Strict):
        name: str

    type: Literal["function"] = "function"
    function: _Fn


class ToolCallFunction(_Strict):
    name: str
    arguments: str | dict[str, Any]


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(_Strict):
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.type != "text":
                raise bad_request(f"messages: content part type {part.type!r} is not supported "
                                  "(infer serves text-only models); send type 'text'",
                                  param="messages")
            parts.append(part.text or "")
        return "".join(parts)


class ChatCompletionRequest(SamplingExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: NonNegInt | None = None
    max_completion_tokens: NonNegInt | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=_MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
    continue_final_message: bool = False
    add_generation_prompt: bool = True


class GenerateRequest(_Strict):
    """SGLang's native ``/generate`` body (single prompt or a batch)."""

    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=_MAX_LOGPROBS)
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None


class TokenizeRequest(_Strict):
    prompt: str | list[str] | None = None
    text: str | None = None
    add_special_tokens: bool = True
    model: str | None = None


class DetokenizeRequest(_Strict):
    tokens: TokenIds | None = None
    input_ids: TokenIds | None = None
    skip_special_tokens: bool = False
    model: str | None = None


class AbortRequest(_Strict):
    rid: str | None = None
    abort_all: bool = False


class EmbeddingRequest(_Strict):
    input: str | list[str] | TokenIds | list[TokenIds]
    model: str | None = None
    encoding_format: Literal["float"] = "float"


M = TypeVar("M", bound=BaseModel)

_SCHEMA_REF = "#/components/schemas/{model}"


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its JSON body with ``parse_body(model, ...)``.

    The routes read raw bodies (to answer OpenAI-style 400s themselves), so FastAPI cannot see
    the body model; this names it in the operation, and ``openapi_schemas`` supplies its schema.
    """
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _SCHEMA_REF.format(model=model.__name__)}}}}}


def openapi_schemas() -> dict[str, Any]:
    """JSON schemas of every request body, keyed by model name (for ``components.schemas``)."""
    from pydantic.json_schema import models_json_schema

    models = (CompletionRequest, ChatCompletionRequest, GenerateRequest, TokenizeRequest,
              DetokenizeRequest, AbortRequest)
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=_SCHEMA_REF)
    return top["$defs"]


def parse_body(model: type[M], raw: bytes) -> M:
    """Validate a JSON body; every failure is a 400 that names the field."""
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as err:
        raise _validation_error(err) from None
    except APIError:
        raise
    except (ValueError, RecursionError) as err:
        raise bad_request(f"invalid request body: {err}", code="invalid_json") from None


def _validation_error(err: ValidationError) -> APIError:
    first = err.errors(include_url=False)[0]
    if first["type"] in ("json_invalid", "json_type"):
        return bad_request(f"malformed JSON body: {first['msg']}", code="invalid_json")
    # drop list indices and the union-member tags pydantic adds ("str", "list[int]", ...)
    fields = [str(p) for p in first["loc"]
              if isinstance(p, str) and p.isidentifier() and p not in _TYPE_TAGS]
    param = ".".join(fields) or None
    where = f"{param}: " if param else ""
    same = [e for e in err.errors() if e["loc"][:1] == first["loc"][:1]]
    msg = first["msg"] if len(same) == 1 else f"wrong type or value ({first['msg'].lower()}, ...)"
    return bad_request(f"{where}{msg}", param=param, code="invalid_value")


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "function"}
