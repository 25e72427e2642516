"""Grammar-constrained decoding through xgrammar (--grammar-backend xgrammar, the default).

One GrammarBackend per engine compiles json_schema / regex / ebnf constraints (cached by text);
each constrained request holds its own matcher. Per step the model runner asks for a bitmask
[B, ceil(V/32)] int32 (all bits set for unconstrained rows) and applies it to the logits; after
sampling, each constrained request's matcher accepts its token.

JSON (a json_schema, and OpenAI's json_object mode as the schema ``{"type": "object"}``) ends when
its value closes: the grammar then allows only a stop token, so the request finishes there. Runs of
whitespace between JSON tokens are at most ``JSON_MAX_WHITESPACE`` characters, so a model cannot
stall in an endless run of newlines or indentation (the usual way JSON mode fails to end).
"""

from __future__ import annotations

from typing import Any

import torch

GRAMMAR_BACKENDS = ("xgrammar",)
JSON_MAX_WHITESPACE = 24  # one newline and the indentation of a value nested 5 levels deep


class GrammarError(ValueError):
    """The constraint text does not compile (bad JSON schema, regex or EBNF)."""


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids or None)
        self.compiler = xgr.GrammarCompiler(info, max_threads=2)
        self.vocab_size = vocab_size
        self._cache: dict[tuple[str, str], Any] = {}

    def compile(self, kind: str, text: str) -> Any:
        key = (kind, text)
        if key not in self._cache:
            try:
                if kind == "json_schema":
                    compiled = (self.compiler.compile_builtin_json_grammar() if text == "$$ANY$$"
                                else self.compiler.compile_json_schema(
                                    text, max_whitespace_cnt=JSON_MAX_WHITESPACE))
                elif kind == "regex":
                    compiled = self.compiler.compile_regex(text)
                elif kind == "ebnf":
                    compiled = self.compiler.compile_grammar(text)
                else:
                    raise GrammarError(f"{kind}: unknown constraint kind")
            except GrammarError:
                raise
            except Exception as exc:
                raise GrammarError(f"{kind}: invalid constraint: {exc}") from exc
            self._cache[key] = compiled
        return self._cache[key]

    def matcher(self, kind: str, text: str) -> Any:
        return self._xgr.GrammarMatcher(self.compile(kind, text))

    def bitmask(self, matchers: list[Any]) -> torch.Tensor:
        """[B, ceil(V/32)] int32 on the host; rows whose matcher is None allow every token."""
        mask = self._xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for i, m in enumerate(matchers):
            if m is not None and not m.is_terminated():
                m.fill_next_token_bitmask(mask, i)
        return mask


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set disallowed logits to -inf in place. logits [B, V], bitmask [B, ceil(V/32)] int32."""
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.to(logits.device)[:, :, None] >> bits) & 1).bool()  # [B, W, 32]
    allowed = allowed.flatten(1)[:, :logits.shape[-1]]
    logits.masked_fill_(~allowed, float("-inf"))
