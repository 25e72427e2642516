"""SamplingParams: what one request asks of the sampler, validated on construction.

Field names follow SGLang's ``sampling_params`` dict. ``validate`` raises ``ValueError`` whose
message starts with the offending field name, so the server can map it to an HTTP 400 ``param``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

_GREEDY_EPS = 1e-6


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 128  # None: until the context is full
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None  # sampling_seed in SGLang; same seed -> same output in any batch
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    logit_bias: dict[str, float] | None = None

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, defaults: dict[str, Any] | None = None
                  ) -> SamplingParams:
        """Build from a SGLang-style dict; unknown keys are an error naming them.

        ``defaults`` (generation_config / --sampling-defaults) fill fields the dict leaves out.
        """
        d = dict(d or {})
        if "sampling_seed" in d:
            d["seed"] = d.pop("sampling_seed")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown sampling parameter (known: {', '.join(sorted(known))})")
        merged = {k: v for k, v in (defaults or {}).items() if k in known}
        merged.update({k: v for k, v in d.items() if v is not None or k == "max_new_tokens"})
        if isinstance(merged.get("stop"), str):
            merged["stop"] = [merged["stop"]]
        if isinstance(merged.get("stop_token_ids"), int):
            merged["stop_token_ids"] = [merged["stop_token_ids"]]
        p = cls(**merged)
        p.validate()
        return p

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # -- checks ----------------------------------------------------------------------------
    def validate(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name}: {why}, got {getattr(self, name)!r}")

        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int)
                                                or self.max_new_tokens < 0):
            bad("max_new_tokens", "must be a non-negative integer")
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            bad("min_new_tokens", "must be a non-negative integer")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            bad("min_new_tokens", f"must not exceed max_new_tokens ({self.max_new_tokens})")
        if not _num(self.temperature) or self.temperature < 0:
            bad("temperature", "must be a number >= 0")
        if not _num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or \
                (self.top_k < 1 and self.top_k != -1):
            bad("top_k", "must be -1 (disabled) or a positive integer")
        if not _num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        if not _num(self.repetition_penalty) or not 0 < self.repetition_penalty <= 2:
            bad("repetition_penalty", "must be in (0, 2]")
        if not _num(self.frequency_penalty) or not -2 <= self.frequency_penalty <= 2:
            bad("frequency_penalty", "must be in [-2, 2]")
        if not _num(self.presence_penalty) or not -2 <= self.presence_penalty <= 2:
            bad("presence_penalty", "must be in [-2, 2]")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "must be a list of non-empty strings")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a list of non-negative token ids")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not -(1 << 63) <= self.seed < 1 << 63):
            bad("seed", "must be an integer in [-2**63, 2**63) (a 64-bit signed integer)")
        if not isinstance(self.n, int) or not 1 <= self.n <= 128:
            bad("n", "must be an integer in [1, 128]")
        if sum(x is not None for x in (self.json_schema, self.regex, self.ebnf)) > 1:
            bad("regex", "only one of json_schema, regex and ebnf may be given")
        if self.logit_bias:
            raise ValueError("logit_bias: not implemented by infer; remove it from the request")

    # -- derived ---------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        """Repetition, frequency or presence penalty: sampling reads the token history."""
        return (self.repetition_penalty != 1.0 or bool(self.frequency_penalty)
                or bool(self.presence_penalty))

    @property
    def grammar(self) -> tuple[str, str] | None:
        for kind in ("json_schema", "regex", "ebnf"):
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        return None


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
