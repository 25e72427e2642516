"""--stream-interval N (SGLang's and vLLM's flag): a streamed response sends the first token at once,
then its new tokens N at a time, then the rest at the end; the text, the tokens and the logprobs
are those of the default interval (1, the shared server), streamed or not."""

from __future__ import annotations

import openai
import pytest

INTERVAL = 3
PROMPTS = ["The quick brown fox", "Hello world! This is", "numbers 0 1 2"]


@pytest.fixture(scope="module")
def grouped(start_server):
    srv = start_server("--served-model-name", "tiny", "--stream-interval", str(INTERVAL))
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _stream(client, prompt: str, max_tokens: int) -> tuple[str, list[list[str]], list[float]]:
    """(text, the tokens of each chunk that has some, every token's logprob) of a stream."""
    text, groups, lps = "", [], []
    for ch in client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                        temperature=0, logprobs=1, stream=True,
                                        extra_body={"ignore_eos": True}):
        for c in ch.choices:
            text += c.text
            if c.logprobs and c.logprobs.tokens:
                groups.append(list(c.logprobs.tokens))
                lps += list(c.logprobs.token_logprobs)
    return text, groups, lps


@pytest.mark.parametrize("max_tokens", [10, 2, 1])
def test_completion_chunks_group_tokens_and_keep_the_text(client, grouped, max_tokens):
    for prompt in PROMPTS:
        text1, groups1, lps1 = _stream(client, prompt, max_tokens)
        text3, groups3, lps3 = _stream(grouped, prompt, max_tokens)
        assert [len(g) for g in groups1] == [1] * max_tokens
        sizes = [len(g) for g in groups3]
        rest = max_tokens - 1
        assert sizes == [1] + [INTERVAL] * (rest // INTERVAL) + ([rest % INTERVAL] if rest % INTERVAL else [])
        assert text3 == text1
        assert [t for g in groups3 for t in g] == [t for g in groups1 for t in g]
        # the same logprobs in the same places (two servers: their prefix caches, and so their
        # kernels' summation orders, differ by a few 1e-4 on this tiny float32 model)
        assert lps3 == pytest.approx(lps1, abs=5e-3)
        whole = grouped.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, extra_body={"ignore_eos": True})
        assert whole.choices[0].text == text1
        assert whole.usage.completion_tokens == max_tokens


def test_chat_stream_and_whole_answer_match_the_default(client, grouped):
    msgs = [{"role": "user", "content": "Paris celsius weather"}]
    kw = {"model": "tiny", "messages": msgs, "max_tokens": 12, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    pieces = {}
    for name, c in (("one", client), ("grouped", grouped)):
        chunks = [ch for ch in c.chat.completions.create(stream=True, **kw) if ch.choices]
        pieces[name] = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
    assert pieces["grouped"] == pieces["one"]
    whole = grouped.chat.completions.create(**kw)
    assert whole.choices[0].message.content == pieces["one"]
    assert whole.usage.completion_tokens == 12


def test_interval_below_one_is_refused(tiny_dir):
    import subprocess

    r = subprocess.run(["infer", "serve", "--model-path", str(tiny_dir), "--device", "cpu",
                        "--stream-interval", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--stream-interval 0: must be at least 1" in r.stderr
    assert "Traceback" not in r.stderr


def test_stop_string_inside_a_group_and_n_choices(client, grouped):
    """A stop string that ends inside a 3-token chunk cuts the text where the default server does,
    for each of n = 2 choices, streamed and not (greedy: two servers' logits differ in the last
    bits, which a sampled choice could turn into another token)."""
    kw = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    text = client.completions.create(**kw).choices[0].text
    assert len(text) > 8, text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = {**kw, "n": 2, "stop": [stop]}
    want = sorted((c.index, c.text, c.finish_reason) for c in client.completions.create(**cut).choices)
    got = sorted((c.index, c.text, c.finish_reason) for c in grouped.completions.create(**cut).choices)
    assert got == want
    streamed: dict[int, str] = {}
    for ch in grouped.completions.create(stream=True, **cut):
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert sorted(streamed.items()) == [(i, t) for i, t, _ in want]
    assert all(r == "stop" and stop not in t for _, t, r in want)
