"""--context-length, --tokenizer-path and --trust-remote-code run on the CPU (through the gate) and
do what they say: the engine limits sequences to the context length, the tokenizer comes from
--tokenizer-path, and a checkpoint's custom config code runs only when trusted. Bad values stop
`infer serve` with exit code 2 before the engine starts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from tiny import CORPUS, hf_greedy, make_tiny_llama, make_tokenizer  # noqa: E402

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    return d, make_tiny_llama(d)  # max_position_embeddings 1024


def _engine(**flags):
    from infer.core import Engine

    flags.setdefault("dtype", "float32")
    flags.setdefault("max_total_tokens", 4096)
    return Engine(**flags)


def _serve(*argv: str):
    from infer.cli.main import app

    return CliRunner().invoke(app, ["serve", *argv], env={"COLUMNS": "300"})


# -- --context-length ------------------------------------------------------------------------
def test_context_length_limits_every_sequence(tiny):
    eng = _engine(model_path=str(tiny[0]), context_length=64)
    try:
        prompt = list(range(10, 70))  # 60 tokens: room for 4 more
        out = eng.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 50})
        assert len(out["output_ids"]) == 4 and out["meta_info"]["finish_reason"]["type"] == "length"
        # the first tokens are the model's own greedy continuation (transformers)
        assert out["output_ids"] == hf_greedy(tiny[1], prompt, 4)
        with pytest.raises(ValueError, match="context length is 64"):
            eng.generate(input_ids=list(range(10, 74)), sampling_params={**GREEDY, "max_new_tokens": 1})
    finally:
        eng.shutdown()


def test_without_context_length_the_model_maximum_applies(tiny):
    eng = _engine(model_path=str(tiny[0]))
    try:
        out = eng.generate(input_ids=list(range(10, 70)), sampling_params={**GREEDY, "max_new_tokens": 20})
        assert len(out["output_ids"]) == 20
    finally:
        eng.shutdown()


@pytest.mark.parametrize("length, message", [
    (4096, "--context-length 4096 exceeds the model's maximum context of 1024 tokens"),
    (1, "--context-length 1: must be at least 2"),
])
def test_bad_context_length_exits_2_before_the_engine(tiny, length, message):
    out = _serve("--model-path", str(tiny[0]), "--context-length", str(length))
    assert out.exit_code == 2 and message in out.output, out.output


# -- --tokenizer-path --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def split_model(tiny, tmp_path_factory):
    """The tiny model's weights without a tokenizer, and a tokenizer folder elsewhere."""
    weights = tmp_path_factory.mktemp("weights_only")
    for f in tiny[0].iterdir():
        if f.name.startswith(("config", "generation_config", "model")):
            shutil.copy2(f, weights / f.name)
    tok_dir = tmp_path_factory.mktemp("tokenizer")
    shutil.copytree(tiny[0], tok_dir, dirs_exist_ok=True,
                    ignore=lambda _, names: [n for n in names if not n.startswith(("tokenizer", "special"))])
    return weights, tok_dir


def test_tokenizer_comes_from_tokenizer_path(split_model):
    from transformers import AutoTokenizer

    weights, tok_dir = split_model
    with pytest.raises(ValueError, match="no usable tokenizer.*--tokenizer-path"):
        _engine(model_path=str(weights))
    eng = _engine(model_path=str(weights), tokenizer_path=str(tok_dir))
    try:
        reference = AutoTokenizer.from_pretrained(tok_dir)
        text = CORPUS[1]
        out = eng.generate(prompt=text, sampling_params={**GREEDY, "max_new_tokens": 6})
        assert out["meta_info"]["prompt_tokens"] == len(reference.encode(text))
        assert out["text"] == reference.decode(out["output_ids"], skip_special_tokens=True)
        assert eng.tokenizer.name_or_path == str(tok_dir)
    finally:
        eng.shutdown()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(split_model, tmp_path):
    weights, _ = split_model
    make_tokenizer(tmp_path, vocab_size=400)  # the model embeds 320 ids
    out = _serve("--model-path", str(weights), "--tokenizer-path", str(tmp_path))
    assert out.exit_code == 2
    assert "the tokenizer has 400 tokens but the model's vocabulary has 320" in out.output


def test_missing_tokenizer_path_exits_2(tiny, tmp_path):
    out = _serve("--model-path", str(tiny[0]), "--tokenizer-path", str(tmp_path / "nope"))
    assert out.exit_code == 2 and "--tokenizer-path" in out.output and "neither an existing" in out.output


# -- --trust-remote-code -----------------------------------------------------------------------
REMOTE_CONFIG = '''from transformers import LlamaConfig


class TinyRemoteConfig(LlamaConfig):
    model_type = "tiny_remote"
'''


@pytest.fixture(scope="module")
def remote_code_model(tiny, tmp_path_factory):
    """The tiny Llama whose config class is custom code shipped in the checkpoint (auto_map)."""
    d = tmp_path_factory.mktemp("remote_code")
    shutil.copytree(tiny[0], d, dirs_exist_ok=True)
    (d / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="tiny_remote", auto_map={"AutoConfig": "configuration_tiny.TinyRemoteConfig"})
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_custom_config_code_needs_trust_remote_code(remote_code_model):
    with pytest.raises(ValueError, match="pass --trust-remote-code"):
        _engine(model_path=str(remote_code_model))
    out = _serve("--model-path", str(remote_code_model))
    assert out.exit_code == 2 and "pass --trust-remote-code" in out.output


def test_trusted_custom_config_loads_and_matches_transformers(remote_code_model, tiny):
    eng = _engine(model_path=str(remote_code_model), trust_remote_code=True)
    try:
        assert type(eng.core.loaded.hf_config).__name__ == "TinyRemoteConfig"
        prompt = list(range(5, 25))
        out = eng.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 8})
        with torch.no_grad():
            assert out["output_ids"] == hf_greedy(tiny[1], prompt, 8)
    finally:
        eng.shutdown()


# -- --skip-tokenizer-init ---------------------------------------------------------------------
def test_skip_tokenizer_init_serves_token_ids_only(split_model, tiny, tmp_path):
    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from server_proc import ServerProc

    weights, _ = split_model  # no tokenizer at all: the server must not need one
    server = ServerProc(weights, tmp_path, "--skip-tokenizer-init", "--dtype", "float32").wait_ready()
    try:
        prompt = list(range(5, 25))
        body = {"input_ids": prompt, "sampling_params": {**GREEDY, "max_new_tokens": 8}}
        out = httpx.post(f"{server.url}/generate", json=body, timeout=120)
        assert out.status_code == 200, out.text
        assert "text" not in out.json() and out.json()["output_ids"] == hf_greedy(tiny[1], prompt, 8)
        with httpx.stream("POST", f"{server.url}/generate", json={**body, "stream": True}, timeout=120) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert len(chunks) > 1 and chunks[-1]["output_ids"] == out.json()["output_ids"]
        for route, payload in [("/generate", {"text": "Hello"}),
                               ("/generate", {**body, "sampling_params": {"stop": ["x"]}}),
                               ("/v1/chat/completions", {"model": str(weights), "messages": [
                                   {"role": "user", "content": "Hi"}]}),
                               ("/v1/completions", {"model": str(weights), "prompt": "Hi"}),
                               ("/tokenize", {"prompt": "Hi"})]:
            refused = httpx.post(f"{server.url}{route}", json=payload, timeout=60)
            assert refused.status_code == 400, (route, refused.text)
            assert "--skip-tokenizer-init" in refused.json()["error"]["message"], route
    finally:
        server.stop()
