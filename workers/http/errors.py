"""The HTTP API's error responses: the documented error codes and the handlers that answer
every error with a ``{"error": <code>, "detail": ...}`` body, each ``CtxcoreError`` from the
one table ``ERROR_STATUSES`` (``workers.api_common.error_statuses``; the proxy registers the
handler of its own errors, which keep their OpenAI body: ``workers.proxy.errors``)."""

from __future__ import annotations

import logging
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError as SqlOperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ctxcore.client.models import ErrorBody
from ctxcore.contract import MAX_NESTING_DEPTH
from ctxcore.errors import CtxcoreError
from workers.api_common.error_statuses import STORE_DOWN, error_status
from workers.api_common.errors import ApiError

__all__ = ["error_responses", "install_error_handlers"]

log = logging.getLogger(__name__)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entry documenting these error statuses."""
    text = {
        400: "Malformed request",
        401: "Missing or unknown bearer token",
        403: "The tenant's conversation limit is reached",
        404: "No such conversation (or not this tenant's)",
        409: "If-Match does not match the log, the conversation is busy, its state cannot be served, "
        "a truncation was refused, or a rollback named a version no longer kept",
        413: "Request body too large",
        422: "Invalid message, budget exceeded, malformed body or invalid conversation id",
        429: "Rate limited (see Retry-After)",
        503: "A store is unavailable (see Retry-After)",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


def _unreadable_body(exc: StarletteHTTPException) -> tuple[str, str] | None:
    """``(type, rule)`` when FastAPI could not parse a JSON body for a reason it does not
    name (its 400 "There was an error parsing the body" carries the cause)."""
    if exc.status_code != 400:
        return None
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return "json_too_deep", (
            "the JSON body nests too deeply to parse (a message's metadata and a tool "
            f"definition may nest at most {MAX_NESTING_DEPTH} levels)"
        )
    if isinstance(cause, UnicodeDecodeError):
        return "json_invalid_utf8", f"the body is not valid UTF-8 (byte {cause.start})"
    return None


def install_error_handlers(app: FastAPI) -> None:
    # Registered by the decorator, whose type keeps each handler's precise exception type.
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    # One handler, one table: Starlette picks it for every subclass by the error's MRO.
    @app.exception_handler(CtxcoreError)
    async def ctxcore_error(request: Request, exc: CtxcoreError) -> JSONResponse:
        entry = error_status(exc)
        if entry.logged:
            log.warning("%s %s: %s %s: %s", request.method, request.url.path, entry.status, entry.code, exc)
        return JSONResponse(
            {"error": entry.code, "detail": entry.detail(exc), **entry.fields(exc)},
            status_code=entry.status,
            headers=entry.headers(exc),
        )

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable during %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(
            {"error": STORE_DOWN.code, "detail": STORE_DOWN.detail(exc)},
            status_code=STORE_DOWN.status,
            headers=STORE_DOWN.headers(exc),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Without "input": a validation error must not echo a (possibly large) body back.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return JSONResponse({"error": "invalid_request", "detail": errors}, status_code=422)

    # Unmatched routes (e.g. an id holding an encoded "/") and wrong methods: the same
    # {"error", "detail"} shape as every other error, not the framework's default body.
    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        unreadable = _unreadable_body(exc)
        if unreadable is not None:
            return JSONResponse(
                {
                    "error": "invalid_request",
                    "detail": [{"loc": ["body"], "msg": unreadable[1], "type": unreadable[0]}],
                },
                status_code=422,
            )
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    for kind in (redis.ConnectionError, redis.TimeoutError, SqlOperationalError, SqlTimeoutError):
        app.add_exception_handler(kind, unavailable)
