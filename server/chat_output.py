"""Per-choice assembly of a chat answer: reasoning, content and tool calls from text deltas.

Order of concerns for each text delta: the reasoning splitter (``--reasoning-parser``) takes
``<think>`` text out, then the tool gate holds back content from where a tool call may start
(``--tool-call-parser``), or all of it when the call is forced by grammar. At the end the held text
is parsed: found calls become ``tool_calls`` and the finish reason ``tool_calls``; text that turns
out not to be a call is released as content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infer.server.reasoning import ReasoningSplitter
from infer.server.tool_parsers import ParsedCall, parse_forced


@dataclass
class ChatPiece:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ParsedCall] = field(default_factory=list)


class ChoiceAssembler:
    def __init__(self, reasoning: ReasoningSplitter | None, tool_parser: Any, forced: bool) -> None:
        self.reasoning = reasoning
        self.parser = tool_parser  # None: tools off
        self.forced = forced
        self.content = ""  # all content text seen
        self.sent = 0  # content[:sent] went out

    def feed(self, text: str, final: bool) -> ChatPiece:
        piece = ChatPiece()
        if self.reasoning is not None:
            piece.reasoning, text = self.reasoning.feed(text, final)
        self.content += text
        if self.forced:
            end = self.sent
        elif self.parser is not None:
            end = max(self.sent, self.parser.hold_from(self.content))
        else:
            end = len(self.content)
        if final:
            return self._finish(piece)
        piece.content, self.sent = self.content[self.sent:end], end
        return piece

    def _finish(self, piece: ChatPiece) -> ChatPiece:
        rest = self.content[self.sent:]
        if self.forced:
            try:
                piece.tool_calls = parse_forced(self.content)
                rest = ""
            except ValueError:
                pass  # the output was cut (length) before the call was complete: show the text
        elif self.parser is not None:
            head, calls = self.parser.parse(self.content)
            if calls:
                piece.tool_calls = calls
                rest = head[self.sent:] if len(head) > self.sent else ""
        piece.content = rest
        self.sent = len(self.content)
        return piece


def tool_calls_json(calls: list[ParsedCall], with_index: bool) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        item: dict[str, Any] = {"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}}
        if with_index:
            item["index"] = i
        out.append(item)
    return out
