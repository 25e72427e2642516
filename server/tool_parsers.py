"""Tool-call parsers (``--tool-call-parser``): find function calls in generated text.

Formats:
  hermes, qwen25  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks after text
  llama3          ``[<|python_tag|>]{"name": ..., "parameters": {...}}`` objects, ``;``-separated
With ``tool_choice`` "required" or a named function the output is forced by a grammar instead
(``forced_schema`` in compact JSON, ``forced_grammar``) and parsed by ``parse_forced``, whatever
the parser.

Streaming: ``hold_from(text)`` says where a tool call may begin; text before it streams as
content, the rest is held and parsed when the sequence ends.

Without ``--tool-call-parser`` the parser is chosen from the chat template when it names exactly one
of the formats above (``detect_parser``); otherwise tool_choice "auto" stays a 400.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from infer.server.protocol import ChatCompletionRequest, NamedToolChoice


@dataclass
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def _partial_hold(text: str, marker: str) -> int:
    """Index from which ``text`` ends with a proper prefix of ``marker`` (len(text) if none)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


def _call(obj: Any, args_key: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def hold_from(self, text: str) -> int:
        i = text.find(self.START)
        return i if i >= 0 else _partial_hold(text, self.START)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        start = text.find(self.START)
        if start < 0:
            return text, []
        calls = []
        for body in self._BLOCK.findall(text[start:]):
            try:
                call = _call(json.loads(body), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []  # malformed: hand back the text unchanged
            calls.append(call)
        return text[:start], calls


class Llama3JsonParser:
    TAG = "<|python_tag|>"

    def hold_from(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or stripped.startswith(("{", self.TAG)) or self.TAG.startswith(stripped):
            return 0
        i = text.find(self.TAG)
        return i if i >= 0 else _partial_hold(text, self.TAG)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        i = text.find(self.TAG)
        content, rest = (text[:i], text[i + len(self.TAG):]) if i >= 0 else ("", text)
        if i < 0 and not text.lstrip().startswith("{"):
            return text, []
        decoder, pos, calls = json.JSONDecoder(), 0, []
        rest = rest.strip()
        while pos < len(rest):
            try:
                obj, end = decoder.raw_decode(rest, pos)
            except json.JSONDecodeError:
                return text, []
            call = _call(obj, "parameters")
            if call is None:
                return text, []
            calls.append(call)
            pos = end
            while pos < len(rest) and rest[pos] in " \n\t;":
                pos += 1
        return content, calls


PARSERS: dict[str, type] = {"hermes": HermesParser, "qwen25": HermesParser, "qwen": HermesParser,
                            "llama3": Llama3JsonParser}


# What in a chat template shows which format the model was trained to call tools in.
_TEMPLATE_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>",),  # Hermes, Qwen2.5, Qwen3
    "llama3": ("<|python_tag|>", '"parameters": dictionary of argument name'),  # Llama 3.1+
}


def detect_parser(chat_template: str | None) -> str | None:
    """The parser whose markers the template holds, when exactly one format's are there."""
    if not chat_template:
        return None
    found = [name for name, marks in _TEMPLATE_MARKERS.items() if any(m in chat_template for m in marks)]
    return found[0] if len(found) == 1 else None


def get_parser(name: str) -> HermesParser | Llama3JsonParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"--tool-call-parser {name!r} is not implemented by infer "
                         f"(implemented: {', '.join(sorted(PARSERS))})") from None


def forced_schema(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema that forces a tool call for tool_choice 'required' or a named function."""
    choice, tools = req.tool_choice, req.tools or []
    if isinstance(choice, NamedToolChoice):
        fn = next((t.function for t in tools if t.function.name == choice.function.name), None)
        if fn is None:
            return None
        return _call_schema(fn.name, fn.parameters)
    if choice == "required" and tools:
        items = {"anyOf": [_call_schema(t.function.name, t.function.parameters) for t in tools]}
        schema = {"type": "array", "minItems": 1, "items": items}
        if not req.parallel_tool_calls:
            schema["maxItems"] = 1
        return schema
    return None


def forced_grammar(schema: dict[str, Any]) -> str:
    """EBNF for a forced call: the schema in compact JSON (no free whitespace to wander in)."""
    import xgrammar

    return str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))


def parse_forced(text: str) -> list[ParsedCall]:
    value = json.loads(text)
    objs = value if isinstance(value, list) else [value]
    calls = [_call(o, "arguments") for o in objs]
    if not calls or any(c is None for c in calls):
        raise ValueError("the forced tool-call output is not a list of {name, arguments} objects")
    return [c for c in calls if c is not None]


def _call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    params = parameters or {"type": "object"}
    return {"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                             "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}
