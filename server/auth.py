"""API keys: ``--api-key`` guards the API routes, ``--admin-api-key`` the admin routes.

Both are FastAPI dependencies (not HTTP middleware, which would hide client disconnects). The
key comes as ``Authorization: Bearer <key>``. Admin routes accept the admin key when one is set,
else the API key; /health, /health_generate and /metrics stay open.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from infer.server.errors import APIError


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _check(request: Request, key: str, what: str) -> None:
    token = _bearer(request)
    if token is None or not hmac.compare_digest(token.encode(), key.encode()):
        raise APIError(401, f"invalid or missing {what}: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def require_api_key(request: Request) -> None:
    key = getattr(request.app.state.infer.args, "api_key", None)
    if key:
        _check(request, key, "API key")


async def require_admin_key(request: Request) -> None:
    args = request.app.state.infer.args
    admin = getattr(args, "admin_api_key", None)
    if admin:
        _check(request, admin, "admin API key")
    elif getattr(args, "api_key", None):
        _check(request, args.api_key, "API key")
