"""Chat prompts: pick the chat template and render OpenAI messages into prompt text.

The template is, in order: ``--chat-template`` (a Jinja file, or a built-in name: ``chatml``,
``llama3``), else the model's own (tokenizer config or GGUF metadata). A model without one and no
``--chat-template`` cannot serve /v1/chat/completions: that route answers 400 saying so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infer.server.errors import bad_request
from infer.server.protocol import ChatCompletionRequest

_BUILTIN = Path(__file__).with_name("templates")


def builtin_template_names() -> list[str]:
    return sorted(p.stem for p in _BUILTIN.glob("*.jinja"))


def resolve_chat_template(option: str | None, model_template: str | None) -> str | None:
    """The template text for ``--chat-template`` (file or name), else the model's; ValueError if unknown."""
    if not option:
        return model_template
    path = Path(option).expanduser()
    if path.is_file():
        return path.read_text()
    builtin = _BUILTIN / f"{option}.jinja"
    if builtin.is_file():
        return builtin.read_text()
    raise ValueError(f"--chat-template {option!r} is neither a readable file nor a built-in template "
                     f"name (built-in: {', '.join(builtin_template_names())})")


def messages_as_dicts(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages in the shape Hugging Face chat templates expect (tool-call arguments as dicts)."""
    out = []
    for m in req.messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.name:
            d["name"] = m.name
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _args_dict(c.function.arguments)}}
                for c in m.tool_calls]
        out.append(d)
    return out


def render_chat(tokenizer: Any, template: str | None, req: ChatCompletionRequest,
                with_tools: bool) -> str:
    if template is None:
        raise bad_request("this model has no chat template; start the server with --chat-template "
                          f"(a Jinja file or one of {', '.join(builtin_template_names())}) or use "
                          "/v1/completions", param="messages")
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if (with_tools and req.tools) else None
    last_assistant = req.messages[-1].role == "assistant"
    kwargs = dict(req.chat_template_kwargs or {})
    try:
        return tokenizer.apply_chat_template(
            messages_as_dicts(req), chat_template=template, tools=tools, tokenize=False,
            add_generation_prompt=req.add_generation_prompt and not (
                req.continue_final_message and last_assistant),
            continue_final_message=req.continue_final_message and last_assistant, **kwargs)
    except Exception as err:  # a template that raises on these messages is a client-side problem
        raise bad_request(f"the chat template could not render these messages: {err}",
                          param="messages") from None


def _args_dict(arguments: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        raise bad_request("messages: tool_calls[].function.arguments must be a JSON object string",
                          param="messages") from None
    if not isinstance(value, dict):
        raise bad_request("messages: tool_calls[].function.arguments must be a JSON object",
                          param="messages")
    return value
