"""OpenAI-style error bodies and the exception that carries one through a route.

Every error the server returns has the shape ``{"error": {"message", "type", "param", "code"}}``
(what the ``openai`` client parses into its exception types). Routes raise ``APIError``; the app's
exception handlers turn it, and any stray exception, into that body. Nothing reaches the client as
a traceback.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    501: "not_implemented_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error with an HTTP status that becomes an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_")
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": code if code is not None else str(status)}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unavailable(message: str, retry_after: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return APIError(503, message, code="service_unavailable", headers=headers)


def from_value_error(err: ValueError) -> APIError:
    """Map a ``ValueError("field: why")`` (SamplingParams' convention) to a 400 naming the field."""
    text = str(err)
    head, sep, _ = text.partition(":")
    param = head.strip() if sep and head.strip().isidentifier() else None
    return bad_request(text, param=param)
