"""``infer generate``: offline generation with every ``infer serve`` flag.

    infer generate --model-path DIR --prompt "Hello" [--prompt ...] [--chat] [--json]
        [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [serve flags]

Without ``--json`` it prints only the generated text of each prompt (one block per prompt);
with ``--json`` one JSON object per prompt per line (SGLang's generate result plus the prompt).
Bad settings or input end with exit code 2 and one message.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from infer.cli.common import fail, with_server_flags
from infer.core.config import ConfigError, ServerArgs


@with_server_flags
def generate(
    prompt: Annotated[Optional[list[str]], typer.Option(
        "--prompt", help="A prompt (repeat for several; they run as one batch).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt.")] = 128,
    temperature: Annotated[Optional[float], typer.Option(
        help="Sampling temperature (0 = greedy); default from the model's generation_config.")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling probability mass.")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Sample from the k most likely tokens (-1: all).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Sampling seed (same seed, same output).")] = None,
    chat: Annotated[bool, typer.Option(
        "--chat", help="Apply the model's chat template to each prompt (as a user message).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per prompt.")] = False,
    *, server_args: ServerArgs,
) -> None:
    """Generate text for one or more prompts offline (no server)."""
    if not prompt:
        fail("--prompt: give at least one prompt")
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                       ("seed", seed)):
        if value is not None:
            params[key] = value
    from infer.core.engine.engine import Engine

    try:
        from infer.core.sampling.params import SamplingParams

        SamplingParams.from_dict(params)  # bad values fail before the model loads
        engine = Engine(server_args=server_args)
    except (ConfigError, ValueError, NotImplementedError) as exc:
        fail(str(exc).replace("\n", " "))
    try:
        if chat:
            tok = engine.tokenizer
            if tok is None or not getattr(tok, "chat_template", None):
                fail("--chat: this model has no chat template; pass --chat-template or drop --chat")
            ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                      add_generation_prompt=True),
                              add_special_tokens=False) for p in prompt]
            results = engine.generate(input_ids=ids, sampling_params=params)
        else:
            results = engine.generate(prompt=list(prompt), sampling_params=params)
    except ValueError as exc:
        fail(str(exc))
    finally:
        engine.shutdown()
    for p, r in zip(prompt, results, strict=True):
        if as_json:
            typer.echo(json.dumps({"prompt": p, **r}))
        else:
            typer.echo(r["text"])
