"""The official `openai` client against a real server (tiny random Llama, real engine)."""

from __future__ import annotations

import json

import openai
import pytest

PROMPT = "The quick brown fox"


def _greedy(client, **kw):
    return client.completions.create(model="tiny", prompt=PROMPT, temperature=0, **kw)


def test_models_list(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny"]


def test_completion_stream_matches_non_stream(client, http):
    full = _greedy(client, max_tokens=12)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    n_prompt = http.post("/tokenize", json={"prompt": PROMPT}).json()["count"]
    assert full.usage.prompt_tokens == n_prompt
    assert full.usage.total_tokens == n_prompt + 12
    chunks = list(_greedy(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == full.choices[0].text
    assert reasons == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_stream_matches_non_stream_and_usage(client, tiny_dir):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
    full = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=10)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                                 max_tokens=10, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert reasons == [full.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert full.usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False))
    assert full.usage.completion_tokens == 10 or full.choices[0].finish_reason == "stop"


def test_greedy_tokens_match_transformers(http, tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tok.encode(PROMPT)
    out = http.post("/generate", json={"input_ids": ids, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}).json()
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=8)[0, len(ids):].tolist()
        logits = model(torch.tensor([ids + ref])).logits[0].float().log_softmax(-1)
    assert out["output_ids"] == ref
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    want = [logits[len(ids) - 1 + i, t].item() for i, t in enumerate(ref)]
    # the engine may compute in bf16 on CPU (dtype auto): ids exact, logprobs to bf16 precision
    assert got == pytest.approx(want, abs=0.05)


def test_n2_and_seed(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, n=2, temperature=1.0, seed=7, max_tokens=6)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.finish_reason in ("length", "stop") for c in r.choices)
    again = client.completions.create(model="tiny", prompt=PROMPT, n=2, temperature=1.0, seed=7,
                                      max_tokens=6)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=5, stream=True))
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks
                if c.choices[0].finish_reason]
    assert sorted(i for i, _ in finishes) == [0, 1]  # exactly one finish_reason per choice


def test_stop_string(client):
    base = _greedy(client, max_tokens=16).choices[0].text
    stop = next((base[i:i + 2] for i in range(3, len(base) - 2) if base[i:i + 2].strip()), None)
    if stop is None:
        pytest.skip(f"greedy output has no usable stop substring: {base!r}")
    cut = base[:base.find(stop)]
    r = _greedy(client, max_tokens=16, stop=[stop])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in _greedy(client, max_tokens=16, stop=stop, stream=True))
    assert streamed == cut


def test_completion_logprobs_and_echo(client):
    r = _greedy(client, max_tokens=5, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) <= 3 and max(top.values()) == pytest.approx(chosen, abs=1e-5)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    echo = _greedy(client, max_tokens=5, echo=True)
    assert echo.choices[0].text == PROMPT + r.choices[0].text
    echo_lp = _greedy(client, max_tokens=5, echo=True, logprobs=1).choices[0].logprobs
    n_prompt = echo.usage.prompt_tokens
    assert len(echo_lp.tokens) == n_prompt + 5
    assert echo_lp.token_logprobs[0] is None and echo_lp.token_logprobs[n_prompt:] == \
        pytest.approx(lp.token_logprobs, abs=0.05)  # bf16, other batch shapes


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       temperature=0, max_tokens=4, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == pytest.approx(c.logprob)
               for c in content)


def test_json_mode_output_parses(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "json please"}], temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool)
    # JSON mode ends when the object closes: the reply is exactly one object (greedy, so fixed)
    for content in ("json please", "Hello world", "numbers 0 1 2"):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": content}], temperature=0, max_tokens=200,
            response_format={"type": "json_object"}, extra_body={"regex": None})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content), dict)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}]


def test_tool_call_round_trip_forced_by_grammar(client):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                       max_tokens=60,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r2 = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, tool_choice="none",
                                        temperature=0, max_tokens=5)
    assert r2.choices[0].message.tool_calls is None and r2.choices[0].finish_reason in ("length", "stop")
    req = client.chat.completions.create(model="tiny", messages=messages[:1], tools=TOOLS,
                                         tool_choice="required", parallel_tool_calls=False,
                                         temperature=0, max_tokens=60)
    assert req.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = list(client.chat.completions.create(
        model="tiny", messages=messages[:1], tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        temperature=0, max_tokens=60, stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == json.loads(req.choices[0].message.tool_calls[0].function.arguments)


def test_tool_call_parser_streaming(client):
    forced = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Rome"\}\}</tool_call>'
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Rome?"}], tools=TOOLS,
              tool_choice="auto", max_tokens=80, extra_body={"regex": forced})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Rome"}
    chunks = list(client.chat.completions.create(stream=True, **kw))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    # (seen once in CI, not reproduced in 400 runs: the stream's own chunks say what came instead)
    assert [c.function.name for c in calls] == ["get_weather"], [c.model_dump() for c in chunks]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


def test_reasoning_parser(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "think"}], max_tokens=60,
              extra_body={"regex": "<think>hmm, yes</think>Paris"})
    msg = client.chat.completions.create(**kw).choices[0].message
    assert msg.model_extra["reasoning_content"] == "hmm, yes" and msg.content == "Paris"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
    assert reasoning == "hmm, yes"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Paris"


def test_errors_are_client_exceptions(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=PROMPT, logit_bias={"5": 1.0})
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="fox " * 600, max_tokens=4)
    assert "context length is 512" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
