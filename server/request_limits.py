"""Bounds checked before any costly work on a request, and long prompts tokenised off the loop.

A request is refused before its prompt is tokenised when it cannot fit:

- its body is larger than ``INFER_MAX_REQUEST_BYTES`` (default 32 MiB): 413, read no further
  (the Content-Length header is checked first; a chunked body is counted as it arrives);
- a prompt text is longer than ``2 * context_length * max_token_chars`` characters, where
  ``max_token_chars`` is the longest token string of the vocabulary: no tokenisation of it can
  fit the context (a token covers at most that many characters; the factor 2 leaves room for
  normalisers), so it is a 400 ``context_length_exceeded`` at once. With --allow-auto-truncate
  the text is cut to that bound instead, which keeps every token the context can hold.

Texts within the bound are tokenised in a worker thread (``encode``), so a long prompt never
holds up /health or the other requests' streams.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import Request
from infer.server.errors import APIError, bad_request

MAX_REQUEST_BYTES_ENV = "INFER_MAX_REQUEST_BYTES"
DEFAULT_MAX_REQUEST_BYTES = 32 << 20


def max_request_bytes() -> int:
    raw = os.environ.get(MAX_REQUEST_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_REQUEST_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_REQUEST_BYTES_ENV}={raw!r}: expected a positive number of bytes")
    return value


def _too_large(size: str, limit: int) -> APIError:
    return APIError(413, f"the request body has {size} bytes, more than the server's limit of {limit} "
                         f"bytes (set {MAX_REQUEST_BYTES_ENV} to change it)", code="request_too_large")


async def read_body(request: Request) -> bytes:
    """The request body, or 413 as soon as it is known to exceed the limit."""
    limit = max_request_bytes()
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(declared, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(f"more than {size - len(chunk)}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def max_token_chars(tokenizer: Any) -> int:
    """The longest token string of the vocabulary (added tokens included), at least 1."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max([len(t) for t in tokens if isinstance(t, str)] or [1])


# Prompts of at most this many characters in all (about a thousand tokens: under a millisecond of
# a fast tokenizer) are tokenised on the event loop, as SGLang's tokenizer manager does; longer
# ones in a worker thread. For a 128-token prompt the thread's hand-off cost more than the encode
# (time from the route's entry to the engine send, 1 client: 2.7-3.4 ms in a thread, 2.5 inline).
INLINE_CHARS = 4096


class PromptEncoder:
    """Tokenises prompt texts for one server: checked against the character bound; long ones
    off the event loop (``INLINE_CHARS``)."""

    def __init__(self, tokenizer: Any, context_length: int, allow_truncate: bool) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.allow_truncate = allow_truncate
        self._max_chars: int | None = None

    async def max_chars(self) -> int:
        """Longest text that might fit the context (computed once, in a thread)."""
        if self._max_chars is None:
            per_token = await asyncio.to_thread(max_token_chars, self.tokenizer)
            self._max_chars = 2 * self.context_length * per_token
        return self._max_chars

    async def encode(self, texts: list[str], add_special_tokens: bool = True,
                     param: str = "prompt") -> list[list[int]]:
        """Token ids of each text; 400 for a text that cannot fit (unless truncation is on)."""
        bound = await self.max_chars()
        checked = []
        for text in texts:
            if len(text) > bound:
                if not self.allow_truncate:
                    raise bad_request(
                        f"the prompt has {len(text)} characters, more than any text of at most "
                        f"{self.context_length} tokens (the model's context length) can have "
                        f"({bound} characters); shorten the prompt (or start the server with "
                        "--allow-auto-truncate)",
                        param=param, code="context_length_exceeded")
                text = text[:bound]
            checked.append(text)
        def run() -> list[list[int]]:
            return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in checked]

        if sum(len(t) for t in checked) <= INLINE_CHARS:
            return run()
        return await asyncio.to_thread(run)
