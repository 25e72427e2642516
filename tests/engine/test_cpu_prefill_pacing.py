"""The CPU platform's scheduling defaults (``infer_cpu.probe``): 512-token prefill chunks (256 for a
GGUF model) mixed with the running decodes, so that with many prompts at once the first tokens
come out request by request instead of all after one long prefill; explicit settings win, and
combinations the defaults cannot join (speculative decoding, pipeline stages, a page size the
chunk is not a multiple of) keep the core's defaults."""

from __future__ import annotations

import pytest
from helpers import random_prompts
from infer.core.config import ServerArgs
from infer.core.config.gate import run_gate
from infer_cpu.probe import CPU_GGUF_PREFILL_CHUNK, CPU_PREFILL_CHUNK, serves_gguf


def _gated(**flags):
    args = ServerArgs(**{"model_path": "unused", **flags})
    run_gate(args)
    return args


def test_cpu_defaults_applied_when_unset():
    args = _gated()
    assert args.chunked_prefill_size == CPU_PREFILL_CHUNK
    assert args.enable_mixed_chunk is True
    assert not args.is_set("chunked_prefill_size") and not args.is_set("enable_mixed_chunk")


@pytest.mark.parametrize("flags, chunk, mixed", [
    ({"chunked_prefill_size": 4096}, 4096, True),                 # the user's chunk wins
    ({"enable_mixed_chunk": False}, CPU_PREFILL_CHUNK, False),    # and their mixing choice
    ({"page_size": 48}, None, True),                              # 512 % 48 != 0: core default
    ({"pp_size": 2, "disable_overlap_schedule": True}, CPU_PREFILL_CHUNK, False),
])
def test_explicit_and_incompatible_settings_keep_theirs(flags, chunk, mixed):
    args = _gated(**flags)
    assert args.chunked_prefill_size == chunk
    assert bool(args.enable_mixed_chunk) is mixed


def test_gguf_models_take_the_smaller_chunk(tmp_path):
    """A GGUF model (a .gguf file, a folder holding one, the default model's alias, --load-format
    gguf) gets CPU_GGUF_PREFILL_CHUNK; safetensors folders, paths that do not exist and hub ids
    (nothing is fetched to look) keep CPU_PREFILL_CHUNK; the user's chunk wins either way."""
    assert CPU_GGUF_PREFILL_CHUNK < CPU_PREFILL_CHUNK
    gguf_file = tmp_path / "m" / "model.Q4_1.gguf"
    gguf_file.parent.mkdir()
    gguf_file.write_bytes(b"GGUF")
    st_dir = tmp_path / "st"
    st_dir.mkdir()
    (st_dir / "model.safetensors").write_bytes(b"")
    (st_dir / "extra.gguf").write_bytes(b"GGUF")  # safetensors first, as the loader reads it
    cases = {str(gguf_file): True, str(gguf_file.parent): True, "smollm2": True,
             str(st_dir): False, str(tmp_path / "missing"): False, "org/name": False}
    for path, gguf in cases.items():
        assert serves_gguf(ServerArgs(model_path=path)) is gguf, path
        assert _gated(model_path=path).chunked_prefill_size == (
            CPU_GGUF_PREFILL_CHUNK if gguf else CPU_PREFILL_CHUNK), path
    assert _gated(model_path=str(st_dir), load_format="gguf").chunked_prefill_size == \
        CPU_GGUF_PREFILL_CHUNK
    assert _gated(model_path=str(gguf_file), chunked_prefill_size=1024).chunked_prefill_size == 1024


def test_first_tokens_come_out_request_by_request(make_core):
    """Four 300-token prompts at once: the first step prefills one whole prompt and part of the
    next (512 tokens), so one request has its first token after step 1; in step 2 that request
    decodes while the rest of the second prompt, the third and part of the fourth prefill."""
    core = make_core()
    assert core.cfg.scheduler.chunked_prefill_size == CPU_PREFILL_CHUNK
    prompts = random_prompts(4, seed=7, lo=300, hi=301)
    for i, p in enumerate(prompts):
        core.add_request(core.make_request(f"r{i}", p, {"max_new_tokens": 4, "temperature": 0,
                                                        "ignore_eos": True}))
    firsts = [{o.rid: len(o.new_token_ids) for o in core.step() if o.new_token_ids}
              for _ in range(2)]
    assert firsts[0] == {"r0": 1}
    assert firsts[1] == {"r0": 1, "r1": 1, "r2": 1}  # r0's decode rode along with the prefills
    while core.has_work():
        core.step()


def test_prefill_pending_until_the_last_prompt_token_ran(make_core):
    """``EngineCore.prefill_pending`` (the engine loop's first-token hand-off asks it): true while
    a prompt waits or is part-way through its chunks, false once every prompt has run; the same
    four 300-token prompts take three 512-token steps."""
    core = make_core()
    assert not core.prefill_pending()
    for i, p in enumerate(random_prompts(4, seed=7, lo=300, hi=301)):
        core.add_request(core.make_request(f"r{i}", p, {"max_new_tokens": 4, "temperature": 0,
                                                        "ignore_eos": True}))
    pending = [core.prefill_pending()]
    while core.has_work():
        core.step()
        pending.append(core.prefill_pending())
    assert pending[:4] == [True, True, True, False]
    assert not any(pending[3:])


def test_streams_names_live_streamed_requests(make_core):
    """``EngineCore.streams`` (the engine loop's first-token hand-off asks it): true for a live
    request added with ``stream=True``, its n > 1 choices included, false for one without and
    once a request has finished."""
    core = make_core()
    params = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
    prompt = random_prompts(1, seed=3, lo=10, hi=11)[0]
    core.add_request(core.make_request("s", prompt, params, stream=True))
    core.add_request(core.make_request("p", prompt, params))
    rids = core.add_request(core.make_request("n", prompt, {**params, "n": 2, "temperature": 1.0},
                                              stream=True))
    assert rids == ["n-0", "n-1"]
    assert [core.streams(r) for r in ("s", "p", "n-0", "n-1", "nobody")] == [True, False, True, True,
                                                                            False]
    while core.has_work():
        core.step()
    assert not any(core.streams(r) for r in ("s", "n-0", "n-1"))
