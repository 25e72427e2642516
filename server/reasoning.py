"""Reasoning parsers (``--reasoning-parser``): split ``<think>...</think>`` from the answer.

deepseek-r1, qwen3-thinking: the template opens ``<think>`` in the prompt, so the output is
reasoning until ``</think>`` (all of it when the tag never comes). qwen3: reasoning only when the output starts
with ``<think>`` (thinking can be switched off by ``chat_template_kwargs.enable_thinking``).
``ReasoningSplitter.feed`` splits streamed deltas; partial tags are held back until decided.
"""

from __future__ import annotations

START, END = "<think>", "</think>"
PARSERS = ("deepseek-r1", "qwen3", "qwen3-thinking")


def check_parser(name: str) -> None:
    if name not in PARSERS:
        raise ValueError(f"--reasoning-parser {name!r} is not implemented by infer "
                         f"(implemented: {', '.join(PARSERS)})")


class ReasoningSplitter:
    def __init__(self, parser: str, thinking: bool = True) -> None:
        check_parser(parser)
        # state: "start" (before any decision), "think" (inside reasoning), "answer"
        self.state = "start" if thinking else "answer"
        self.forced = parser in ("deepseek-r1", "qwen3-thinking")
        self.buf = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """Returns (reasoning, content) text that is now certain."""
        self.buf += delta
        reasoning = content = ""
        while self.buf:
            if self.state == "start":
                text = self.buf.lstrip()
                if text.startswith(START):
                    self.buf, self.state = text[len(START):], "think"
                elif START.startswith(text) and not final:
                    return reasoning, content  # could still become <think>
                else:
                    self.state = "think" if self.forced else "answer"
            elif self.state == "think":
                i = self.buf.find(END)
                if i >= 0:
                    reasoning += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(END):].lstrip("\n"), "answer"
                    continue
                keep = 0 if final else _partial(self.buf, END)
                reasoning += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content
            else:
                content += self.buf
                self.buf = ""
        return reasoning, content

    def split(self, text: str) -> tuple[str, str]:
        return self.feed(text, final=True)


def _partial(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
