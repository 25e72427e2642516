"""transformers' config and tokenizer built from a GGUF file, kept between starts
(``model_config.gguf_built``): the second load reads the saved folder instead of parsing the
file again, a changed file or a damaged folder builds again, a cache that cannot be written still
gives the built object; and for the default model the cached config and tokenizer are the ones
built from the file (token for token, template and special ids)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from infer.core.model.loader.model_config import gguf_built, load_tokenizer, read_config
from infer.core.model.loader.source import resolve_source


class Saved:
    """A stand-in for a config / tokenizer: ``save_pretrained`` writes its value as JSON."""

    def __init__(self, value: int) -> None:
        self.value = value

    def save_pretrained(self, folder: str) -> None:
        Path(folder, "v.json").write_text(json.dumps(self.value))


def _reload(folder: str) -> Saved:
    return Saved(json.loads(Path(folder, "v.json").read_text()))


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF one")
    return f


def test_built_once_then_reloaded(gguf_file):
    calls = []

    def build():
        calls.append(1)
        return Saved(len(calls))

    assert gguf_built(gguf_file, "config", build, _reload).value == 1
    again = gguf_built(gguf_file, "config", build, _reload)
    assert again.value == 1 and len(calls) == 1  # from the saved folder, not built
    assert gguf_built(gguf_file, "tokenizer", build, _reload).value == 2  # each part its own
    assert not list((gguf_file.parent / "cache" / "gguf-meta").glob("*/.*"))  # no temp left


def test_a_changed_file_or_a_damaged_folder_builds_again(gguf_file):
    n = iter(range(10))
    build = lambda: Saved(next(n))  # noqa: E731
    assert gguf_built(gguf_file, "config", build, _reload).value == 0
    gguf_file.write_bytes(b"GGUF two, longer")  # size (and mtime) change the key
    assert gguf_built(gguf_file, "config", build, _reload).value == 1
    st = gguf_file.stat()
    os.utime(gguf_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # mtime alone
    assert gguf_built(gguf_file, "config", build, _reload).value == 2
    (folder,) = [p for p in (gguf_file.parent / "cache" / "gguf-meta").glob("*/config")
                 if json.loads((p / "v.json").read_text()) == 2]
    (folder / "v.json").write_text("not json")  # ValueError on reload
    assert gguf_built(gguf_file, "config", build, _reload).value == 3
    assert gguf_built(gguf_file, "config", build, _reload).value == 3  # and it was replaced

    def broken(folder: str) -> Saved:
        raise Exception("what the tokenizers library raises for a bad tokenizer.json")

    assert gguf_built(gguf_file, "config", build, broken).value == 4


def test_an_unwritable_cache_still_gives_the_built_object(gguf_file, tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("INFER_CACHE_DIR", str(blocker))  # mkdir under a file fails
    n = iter(range(10))
    assert gguf_built(gguf_file, "config", lambda: Saved(next(n)), _reload).value == 0
    assert gguf_built(gguf_file, "config", lambda: Saved(next(n)), _reload).value == 1


@pytest.mark.slow
def test_default_model_cached_config_and_tokenizer_match_the_file(tmp_path, monkeypatch):
    from infer.core.model.loader.default_model import ensure_default_model

    path = ensure_default_model(quiet=True)
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))  # the meta cache only; path is resolved
    src = resolve_source(str(path))
    configs = [read_config(src, False) for _ in range(2)]  # built, then from the cache
    vocab = configs[0].vocab_size
    toks = [load_tokenizer(src, None, False, None, vocab) for _ in range(2)]  # the same
    assert (tmp_path / "gguf-meta").is_dir() and len(list(tmp_path.glob("gguf-meta/*/*"))) == 2

    def plain(c):
        return {k: v for k, v in c.to_dict().items() if k not in ("transformers_version", "_name_or_path")}

    assert plain(configs[0]) == plain(configs[1])
    built, cached = toks
    assert type(built) is type(cached) and len(built) == len(cached) == 49152
    texts = ["What is the capital of France?", "  spaces\n\ttabs", "<|im_start|>user\nHi<|im_end|>",
             "naïve café 日本語 🙂", "x" * 50, ""]
    assert [built(t).input_ids for t in texts] == [cached(t).input_ids for t in texts]
    ids = list(range(0, 49152, 997))
    assert built.convert_ids_to_tokens(ids) == cached.convert_ids_to_tokens(ids)
    assert built.decode(ids) == cached.decode(ids)
    assert built.all_special_ids == cached.all_special_ids and built.eos_token_id == cached.eos_token_id
    msgs = [{"role": "user", "content": "Hi"}]
    assert built.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        cached.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
