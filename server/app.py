"""The FastAPI application: routes, error handlers and the shared ``ServerState``.

No ``@app.middleware("http")`` (it would hide client disconnects from the routes): API keys are
route dependencies, errors are exception handlers. Every error leaves as an OpenAI-style body;
an unexpected exception is logged with its traceback and answered 500 without it.

The OpenAPI document is served at /openapi.json (and read by /docs); the request bodies in it are
the pydantic models of ``protocol`` that the routes validate with.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from infer.server import routes_native, routes_openai
from infer.server.errors import APIError, error_body
from infer.server.protocol import openapi_schemas
from infer.server.serving import ServerState
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("infer.server")


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="infer", root_path=getattr(state.args, "fastapi_root_path", "") or "",
                  docs_url="/docs", redoc_url=None, openapi_url="/openapi.json")
    app.state.infer = state
    app.include_router(routes_native.open_router)
    app.include_router(routes_native.api_router)
    app.include_router(routes_native.admin_router)
    app.include_router(routes_openai.router)

    # not offered, so not in the OpenAPI document; the route stays to answer a clear 501
    @app.post("/v1/embeddings", include_in_schema=False)
    async def embeddings(request: Request) -> JSONResponse:
        raise APIError(501, "embeddings are not implemented by infer (--is-embedding is "
                            "not-implemented in the support matrix)", code="not_implemented")

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, f"invalid request: {err.errors()[:1]}"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = str(err.detail)
        if err.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif err.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(err.status_code, message), status_code=err.status_code,
                            headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(err).__name__}: {err}"),
                            status_code=500)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(openapi_schemas())
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
