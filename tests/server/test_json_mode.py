"""JSON mode (response_format json_object) ends: the grammar the server compiles for it.

The route turns ``{"type": "json_object"}`` into the schema ``{"type": "object"}``; the engine
compiles it with ``GrammarBackend``. Once the object closes only a stop token may follow, and a run
of whitespace inside it is bounded, so a model cannot stall in newlines or indentation until
max_tokens. (The official client's JSON-mode reply is parsed in test_openai_client.py.)
"""

from __future__ import annotations

import json

import pytest
from infer.core.sampling.grammar import JSON_MAX_WHITESPACE, GrammarBackend
from infer.server.openai_format import sampling_fields
from infer.server.protocol import ChatCompletionRequest
from tiny_model import make_tokenizer


@pytest.fixture(scope="module")
def json_object(tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory.mktemp("tok"))
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                 "response_format": {"type": "json_object"}})
    schema = sampling_fields(body, 16)["json_schema"]
    backend = GrammarBackend(tok, len(tok), [tok.eos_token_id])
    return tok, backend, schema


def _allowed(backend, matcher) -> set[int]:
    mask = backend.bitmask([matcher])[0]
    return {i for i in range(backend.vocab_size) if (int(mask[i // 32]) >> (i % 32)) & 1}


def test_only_a_stop_token_follows_the_closed_object(json_object):
    tok, backend, schema = json_object
    m = backend.matcher("json_schema", schema)
    for t in tok.encode('{"city": "Paris", "n": [1, 2]}', add_special_tokens=False):
        assert m.accept_token(t)
    assert _allowed(backend, m) == {tok.eos_token_id}
    assert m.accept_token(tok.eos_token_id) and m.is_terminated()


@pytest.mark.parametrize("where", ['{', '{"a":', '{"a": 1,'])
def test_whitespace_runs_are_bounded(json_object, where):
    tok, backend, schema = json_object
    m = backend.matcher("json_schema", schema)
    for t in tok.encode(where, add_special_tokens=False):
        assert m.accept_token(t)
    newline, space = tok.convert_tokens_to_ids("\u010a"), tok.convert_tokens_to_ids("\u0120")  # "\n", " "
    run = 0
    while run < 10 * JSON_MAX_WHITESPACE and m.accept_token(newline if run == 0 else space):
        run += 1
    assert run == JSON_MAX_WHITESPACE
    assert not _allowed(backend, m) & {newline, space}


def test_the_schema_is_an_object(json_object):
    assert json.loads(json_object[2]) == {"type": "object"}
