"""Tool-call and reasoning parsers, stream splitting, request validation (pure functions)."""

from __future__ import annotations

import json

import pytest
from infer.server.chat import builtin_template_names, resolve_chat_template
from infer.server.chat_output import ChoiceAssembler
from infer.server.errors import APIError
from infer.server.generation import fit_context
from infer.server.protocol import ChatCompletionRequest, parse_body
from infer.server.reasoning import ReasoningSplitter
from infer.server.tool_parsers import HermesParser, Llama3JsonParser, forced_schema, get_parser, parse_forced


def _feed_all(asm: ChoiceAssembler, pieces: list[str]):
    out = [asm.feed(p, final=False) for p in pieces[:-1]] + [asm.feed(pieces[-1], final=True)]
    return ("".join(o.content for o in out), "".join(o.reasoning for o in out),
            [c for o in out for c in o.tool_calls])


def test_hermes_parse_and_stream_hold():
    text = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n' \
           '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    content, calls = HermesParser().parse(text)
    assert content == "Let me check.\n" and [c.name for c in calls] == ["f", "g"]
    assert json.loads(calls[0].arguments) == {"a": 1}
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    streamed, _, calls = _feed_all(ChoiceAssembler(None, HermesParser(), False), pieces)
    assert streamed == "Let me check.\n" and [c.name for c in calls] == ["f", "g"]


def test_hermes_malformed_is_content():
    text = "<tool_call>{not json}</tool_call>"
    assert HermesParser().parse(text) == (text, [])
    streamed, _, calls = _feed_all(ChoiceAssembler(None, HermesParser(), False), [text[:5], text[5:]])
    assert streamed == text and calls == []


def test_llama3_json_parser():
    p = Llama3JsonParser()
    content, calls = p.parse('<|python_tag|>{"name": "f", "parameters": {"x": "y"}}; {"name": "g", "parameters": {}}')
    assert content == "" and [c.name for c in calls] == ["f", "g"] and json.loads(calls[0].arguments) == {"x": "y"}
    assert p.parse("plain answer") == ("plain answer", [])
    assert p.hold_from("plain") == 5 and p.hold_from("  {") == 0


def test_unknown_parser_names_the_implemented_ones():
    with pytest.raises(ValueError, match="qwen25"):
        get_parser("mistral")


@pytest.mark.parametrize(("parser", "pieces", "reasoning", "content"), [
    ("qwen3", ["<th", "ink>abc</th", "ink>\n\nanswer"], "abc", "answer"),
    ("qwen3", ["no thinking here"], "", "no thinking here"),
    ("deepseek-r1", ["step 1, ", "step 2</think>done"], "step 1, step 2", "done"),
    ("deepseek-r1", ["all reasoning"], "all reasoning", ""),
    ("qwen3-thinking", ["x</think>y"], "x", "y"),
])
def test_reasoning_splitter(parser, pieces, reasoning, content):
    asm = ChoiceAssembler(ReasoningSplitter(parser), None, False)
    got_content, got_reasoning, _ = _feed_all(asm, pieces)
    assert (got_reasoning, got_content) == (reasoning, content)


def test_reasoning_off_when_thinking_disabled():
    assert ReasoningSplitter("qwen3", thinking=False).split("<think>a</think>b") == ("", "<think>a</think>b")


def test_forced_tool_choice_schema_and_parse():
    body = json.dumps({"messages": [{"role": "user", "content": "x"}],
                       "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                       "tool_choice": {"type": "function", "function": {"name": "f"}}}).encode()
    req = parse_body(ChatCompletionRequest, body)
    schema = forced_schema(req)
    assert schema["properties"]["name"] == {"type": "string", "enum": ["f"]}
    calls = parse_forced('{"name": "f", "arguments": {"k": 1}}')
    assert calls[0].name == "f" and json.loads(calls[0].arguments) == {"k": 1}
    with pytest.raises(ValueError):
        parse_forced('[{"nom": 1}]')


def test_fit_context():
    assert fit_context([1] * 10, 5, 100, False) == ([1] * 10, 5)
    assert fit_context([1] * 10, None, 100, False) == ([1] * 10, 90)
    with pytest.raises(APIError, match="100 tokens"):
        fit_context([1] * 100, 5, 100, False)
    with pytest.raises(APIError, match="lower max_tokens to at most 90"):
        fit_context([1] * 10, 95, 100, False)
    assert fit_context([1] * 150, 5, 100, True) == ([1] * 99, 1)


def test_chat_template_option(tmp_path):
    custom = tmp_path / "t.jinja"
    custom.write_text("{{ messages[0]['content'] }}")
    assert resolve_chat_template(str(custom), "model's") == "{{ messages[0]['content'] }}"
    assert {"chatml", "llama3"} <= set(builtin_template_names())
    assert "<|im_start|>" in resolve_chat_template("chatml", None)
    assert resolve_chat_template(None, "model's") == "model's"
    with pytest.raises(ValueError, match="built-in"):
        resolve_chat_template("no-such-template", None)
