"""Benchmark inputs: request lengths and random prompts built with a local tokenizer.

Lengths follow SGLang's random dataset: each request's input and output length is drawn
uniformly from ``[len * range_ratio, len]`` (``range_ratio=1`` gives fixed lengths).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    prompt_ids: list[int]
    output_len: int

    @property
    def input_len(self) -> int:
        return len(self.prompt_ids)


def sample_lengths(num: int, input_len: int, output_len: int, range_ratio: float,
                   rng: random.Random) -> list[tuple[int, int]]:
    """``num`` (input, output) lengths, each uniform in [len * range_ratio, len], at least 1."""
    if not 0 < range_ratio <= 1:
        raise ValueError(f"range ratio must be in (0, 1], got {range_ratio}")
    if num < 1 or input_len < 1 or output_len < 1:
        raise ValueError("number of prompts and lengths must be at least 1")

    def draw(n: int) -> int:
        return rng.randint(max(1, int(n * range_ratio)), n)

    return [(draw(input_len), draw(output_len)) for _ in range(num)]


def load_tokenizer(path: str) -> Any:
    """A transformers tokenizer from an HF folder, a .gguf file, or the ``smollm2`` alias."""
    from infer.core.model.loader.default_model import resolve_alias

    path = resolve_alias(path)
    if path.endswith(".gguf"):
        from infer.core.model.loader.gguf_reader import GGUFCheckpoint

        return GGUFCheckpoint(path).tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _vocab_ids(tokenizer: Any) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(len(tokenizer)) if i not in special]


def random_requests(tokenizer: Any, lengths: list[tuple[int, int]], rng: random.Random,
                    ) -> list[BenchRequest]:
    """Prompts of random ordinary tokens whose re-tokenized length is exactly the drawn length
    (text is decoded and re-encoded until it is stable; padding with a common token if short)."""
    ids = _vocab_ids(tokenizer)
    pad = tokenizer.encode(" the", add_special_tokens=False)[-1]
    out = []
    for in_len, out_len in lengths:
        toks = [rng.choice(ids) for _ in range(in_len)]
        for _ in range(4):
            text = tokenizer.decode(toks)
            toks = tokenizer.encode(text, add_special_tokens=False)[:in_len]
            toks += [pad] * (in_len - len(toks))
        text = tokenizer.decode(toks)
        out.append(BenchRequest(prompt=text, prompt_ids=tokenizer.encode(text, add_special_tokens=False),
                                output_len=out_len))
    return out


def random_id_requests(vocab_size: int, lengths: list[tuple[int, int]], rng: random.Random,
                       ) -> list[BenchRequest]:
    """Token-id prompts without a tokenizer (for engine-level benchmarks)."""
    return [BenchRequest(prompt="", prompt_ids=[rng.randrange(vocab_size) for _ in range(i)],
                         output_len=o) for i, o in lengths]
