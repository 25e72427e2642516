"""tool_choice "auto" without --tool-call-parser: the chat template picks the parser when it can.

A template that holds exactly one format's markers (Hermes/Qwen ``<tool_call>``, Llama 3.1's
``<|python_tag|>``) chooses that parser, and the choice is logged; any other template keeps the
400 that says to start the server with --tool-call-parser (tested on a chatml server in
test_protection.py).
"""

from __future__ import annotations

import json

import openai
import pytest
from infer.server.chat import resolve_chat_template
from infer.server.tool_parsers import detect_parser
from tiny_model import CHAT_TEMPLATE

LLAMA31_TOOLS = ('{{- "Given the following functions, please respond with a JSON for a function call '
                 'with its proper arguments that best answers the given prompt.\\n\\n" }}{{- "Respond in the '
                 'format {\\"name\\": function name, \\"parameters\\": dictionary of argument name and its '
                 'value}." }}{%- if tool_call %}{{- "<|python_tag|>" }}{%- endif %}')


@pytest.mark.parametrize(("template", "parser"), [
    (CHAT_TEMPLATE, "hermes"),
    (LLAMA31_TOOLS, "llama3"),
    (resolve_chat_template("chatml", None), None),
    (resolve_chat_template("llama3", None), None),
    (CHAT_TEMPLATE + LLAMA31_TOOLS, None),  # two formats: ambiguous
    (None, None),
])
def test_detect_parser(template, parser):
    assert detect_parser(template) == parser


def test_auto_tool_choice_uses_the_template_parser(start_server):
    srv = start_server("--skip-server-warmup", "--served-model-name", "tiny")
    assert "default: --tool-call-parser hermes" in srv.output()
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    forced = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Rome"\}\}</tool_call>'
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Rome?"}],
                                       tools=tools, max_tokens=80, extra_body={"regex": forced})
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Rome"}
