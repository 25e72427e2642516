"""Incremental detokenization: identical to decoding at once, multi-byte safe, stop strings."""

from __future__ import annotations

import pytest
from infer.core.engine.detokenizer import IncrementalDetokenizer, StopStringDetokenizer
from transformers import AutoTokenizer

TEXTS = ["Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600 done.", "Hello world! This is  spaced\n\ttext.",
         "\U0001f600\U0001f601\u00e9\u00e9 \u4e2d\u6587\u5b57"]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model[0])


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids) or text == TEXTS[1]
    d = IncrementalDetokenizer(tok)
    deltas = [d.add([i]) for i in ids]
    deltas.append(d.flush())
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in x for x in deltas), "a split character leaked as U+FFFD"


def test_prompt_context_and_chunks(tok):
    prompt = tok.encode("Hello", add_special_tokens=False)
    ids = tok.encode(" world! This is", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, prefix_ids=prompt)
    out = d.add(ids[:2]) + d.add(ids[2:]) + d.flush()
    assert out == " world! This is"


def test_special_tokens(tok):
    ids = [tok.bos_token_id] + tok.encode("Hello", add_special_tokens=False) + [tok.eos_token_id]
    skip = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert skip.add(ids) + skip.flush() == "Hello"
    spaced = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert spaced.add(ids) + spaced.flush() == "<s> Hello </s>"
    tight = IncrementalDetokenizer(tok, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert tight.add(ids) + tight.flush() == "<s>Hello</s>"


def test_stop_string_is_cut_and_held_back(tok):
    ids = tok.encode("The quick brown fox jumps over", add_special_tokens=False)
    s = StopStringDetokenizer(IncrementalDetokenizer(tok), ["brown f"])
    released = []
    for i in ids:
        released.append(s.add([i]))
        assert "brown" not in s.text
    assert s.matched == "brown f"
    assert s.text == "The quick "
    keep = StopStringDetokenizer(IncrementalDetokenizer(tok), ["brown f"], no_stop_trim=True)
    for i in ids:
        keep.add([i])
    assert keep.text == "The quick brown f"
    none = StopStringDetokenizer(IncrementalDetokenizer(tok), ["zebra"])
    for i in ids:
        none.add([i])
    assert none.text + none.finish() == "The quick brown fox jumps over"


def test_the_direct_backend_decode_gives_the_tokenizers_own_text(tok):
    """``direct_decoder`` (the Rust decode, skipping transformers' Python wrapper) is taken for
    this fast tokenizer, and gives ``tokenizer.decode``'s text for any ids, specials included."""
    import random

    from infer.core.engine.detokenizer import direct_decoder

    direct = direct_decoder(tok)
    assert direct is not None  # so the incremental tests above run on it
    rng = random.Random(0)
    specials = sorted(set(tok.all_special_ids))
    for n in range(300):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 9))]
        if n % 3 == 0:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        for skip in (True, False):
            assert direct(ids, skip) == tok.decode(ids, skip_special_tokens=skip), (ids, skip)


def test_no_direct_decode_where_the_tokenizer_decodes_its_own_way(tok):
    from infer.core.engine.detokenizer import IncrementalDetokenizer, direct_decoder

    class Shouting(type(tok)):  # a model's class that post-processes its text
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    loud = Shouting.from_pretrained(tok.name_or_path)
    assert direct_decoder(loud) is None
    d = IncrementalDetokenizer(loud)
    ids = loud.encode("Hello there", add_special_tokens=False)
    assert d.add(ids) + d.flush() == "HELLO THERE"
    tidy = type(tok).from_pretrained(tok.name_or_path, clean_up_tokenization_spaces=True)
    assert direct_decoder(tidy) is None
    assert direct_decoder(object()) is None
