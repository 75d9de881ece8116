"""The HTTP API's error responses: ``ApiError``, the documented error codes and
``ERROR_STATUSES``, the one table that answers each ``CtxcoreError`` subclass with one status
and a ``{"error": <code>, "detail": ...}`` body (the proxy answers in OpenAI's shape,
``workers/proxy_errors.py``, falling back on this table's statuses)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError as SqlOperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ctxcore.client.models import ErrorBody
from ctxcore.errors import ApiError as ClientApiError
from ctxcore.errors import (
    AuthenticationError,
    BudgetExceeded,
    ConfigError,
    ConflictError,
    CtxcoreError,
    CursorNotFoundError,
    InvalidKeyError,
    InvalidMessageError,
    InvalidWindowError,
    ModelError,
    NotFoundError,
    QuotaExceeded,
    RateLimited,
    RecallDisabled,
    StoreError,
    StoreUnavailable,
    TruncateRefused,
    UnsupportedItemError,
)
from ctxcore.summarize.errors import ModelCallError
from workers.circuit import CircuitOpenError
from workers.failures import StageFailedError

__all__ = [
    "ERROR_STATUSES",
    "ApiError",
    "ErrorStatus",
    "error_responses",
    "error_status",
    "install_error_handlers",
    "invalid_message_error",
    "not_found",
]

log = logging.getLogger(__name__)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entry documenting these error statuses."""
    text = {
        400: "Malformed request",
        401: "Missing or unknown bearer token",
        403: "The tenant's conversation limit is reached",
        404: "No such conversation (or not this tenant's)",
        409: "If-Match does not match the log, the conversation is busy, its state cannot be served, "
        "or a truncation was refused",
        413: "Request body too large",
        422: "Invalid message, budget exceeded or malformed body",
        429: "Rate limited (see Retry-After)",
        503: "A store is unavailable (see Retry-After)",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


class ApiError(Exception):
    """An error response: status, code, detail, extra body fields and headers."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        return JSONResponse(
            {"error": self.error, "detail": self.detail, **self.extra},
            status_code=self.status,
            headers=self.headers,
        )


def not_found(what: str = "conversation") -> ApiError:
    # The same body for unknown, invalid and foreign ids: nothing is revealed.
    return ApiError(404, "not_found", f"{what} not found")


def invalid_message_error(exc: InvalidMessageError, location: str) -> ApiError:
    return ApiError(422, "invalid_message", exc.detail, index=exc.index, field=exc.field, location=location)


def _no_fields(_: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ErrorStatus:
    """How one error class is answered: status, body code, the body's detail and extra
    fields, headers, and whether the server logs it (failures of the server's side)."""

    status: int
    code: str
    detail: Callable[[Any], str] = str
    fields: Callable[[Any], dict[str, Any]] = _no_fields
    headers: Callable[[Any], dict[str, str] | None] = field(default=lambda _: None)
    logged: bool = False


def _masked(text: str) -> Callable[[Any], str]:
    # Driver messages and internal addresses stay in the server's log, out of the response.
    return lambda _: text


def _retry_after(seconds: float | None) -> dict[str, str]:
    return {"Retry-After": str(max(math.ceil(seconds or 1), 1))}


_STORE_DOWN = ErrorStatus(
    503,
    "store_unavailable",
    _masked("a store is unavailable; retry later"),
    headers=lambda _: _retry_after(1),
    logged=True,
)
_MODEL_FAILED = ErrorStatus(
    502,
    "model_error",
    lambda x: f"the summarisation model failed ({x.kind}); see the server log",
    logged=True,
)
_INVALID_MESSAGE = ErrorStatus(
    422,
    "invalid_message",
    lambda x: x.detail,
    lambda x: {"index": x.index, "field": x.field, "location": "messages"},
)
_UPSTREAM = ErrorStatus(502, "upstream_error", _masked("a call to another ctxcore API failed"), logged=True)

# Every CtxcoreError subclass, by what the caller can do about it (a test fails on one
# missing). The HTTP client maps the statuses back to the same classes (client/errors.py).
ERROR_STATUSES: dict[type[CtxcoreError], ErrorStatus] = {
    # The request is wrong: fix it.
    CtxcoreError: ErrorStatus(400, "ctxcore_error"),
    InvalidMessageError: _INVALID_MESSAGE,
    UnsupportedItemError: _INVALID_MESSAGE,
    BudgetExceeded: ErrorStatus(
        422,
        "budget_exceeded",
        fields=lambda x: {
            "budget": x.budget,
            "system_tokens": x.system_tokens,
            "tools_tokens": x.tools_tokens,
            "anchor_tokens": x.anchor_tokens,
        },
    ),
    ConfigError: ErrorStatus(422, "invalid_config"),
    # An invalid id answers like an unknown or foreign one: nothing is revealed.
    InvalidKeyError: ErrorStatus(404, "not_found", _masked("conversation not found")),
    NotFoundError: ErrorStatus(404, "not_found"),
    AuthenticationError: ErrorStatus(
        401, "unauthorized", headers=lambda _: {"WWW-Authenticate": 'Bearer realm="ctxcore"'}
    ),
    QuotaExceeded: ErrorStatus(403, "conversation_limit"),
    RateLimited: ErrorStatus(429, "rate_limited", headers=lambda x: _retry_after(x.retry_after)),
    # The conversation's state says no: re-read, retry against it or roll back.
    ConflictError: ErrorStatus(409, "conflict"),
    TruncateRefused: ErrorStatus(
        409,
        "truncate_refused",
        fields=lambda x: {"reason": x.reason, "last_id": x.last_id},
        headers=lambda x: {"ETag": f'"{x.last_id}"'} if x.last_id else None,
    ),
    RecallDisabled: ErrorStatus(409, "recall_disabled", fields=lambda x: {"setting": x.setting}),
    InvalidWindowError: ErrorStatus(
        409,
        "invalid_window",
        fields=lambda x: {
            "state_version": x.state_version,
            "violations": [{"index": v.index, "rule": v.rule, "detail": v.detail} for v in x.violations],
        },
        logged=True,
    ),
    # The saved state names log ids the log lacks: roll the conversation back.
    CursorNotFoundError: ErrorStatus(409, "invalid_state", logged=True),
    # The server's side failed: retry later (503) or report it (502).
    StoreUnavailable: _STORE_DOWN,
    StoreError: ErrorStatus(502, "store_error", _masked("a store failed; see the server log"), logged=True),
    ModelError: _MODEL_FAILED,
    ModelCallError: _MODEL_FAILED,
    StageFailedError: _MODEL_FAILED,
    CircuitOpenError: ErrorStatus(
        503,
        "circuit_open",
        _masked("the summarisation endpoint's circuit is open; retry later"),
        headers=lambda x: _retry_after(x.retry_after),
    ),
    ClientApiError: _UPSTREAM,
}


def error_status(exc: CtxcoreError) -> ErrorStatus:
    """The table's entry for ``exc``: its class's, else its nearest listed base's."""
    for kind in type(exc).__mro__:
        if kind in ERROR_STATUSES:
            return ERROR_STATUSES[kind]
    return ERROR_STATUSES[CtxcoreError]


def _ctxcore_response(request: Request, exc: CtxcoreError) -> JSONResponse:
    entry = error_status(exc)
    if entry.logged:
        log.warning("%s %s: %s %s: %s", request.method, request.url.path, entry.status, entry.code, exc)
    return JSONResponse(
        {"error": entry.code, "detail": entry.detail(exc), **entry.fields(exc)},
        status_code=entry.status,
        headers=entry.headers(exc),
    )


def install_error_handlers(app: FastAPI) -> None:
    # Imported here: the proxy's errors module imports this one.
    from workers.proxy_errors import ProxyError

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, ApiError | ProxyError):
            raise TypeError(f"api_error got {exc!r}")
        return exc.response()

    async def ctxcore_error(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, CtxcoreError):
            raise TypeError(f"ctxcore_error got {exc!r}")
        return _ctxcore_response(request, exc)

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable during %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(
            {"error": _STORE_DOWN.code, "detail": _STORE_DOWN.detail(exc)},
            status_code=_STORE_DOWN.status,
            headers=_STORE_DOWN.headers(exc),
        )

    async def invalid_request(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, RequestValidationError):
            raise TypeError(f"invalid_request got {exc!r}")
        # Without "input": a validation error must not echo a (possibly large) body back.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return JSONResponse({"error": "invalid_request", "detail": errors}, status_code=422)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        # Unmatched routes (e.g. an id holding an encoded "/") and wrong methods: the same
        # {"error", "detail"} shape as every other error, not the framework's default body.
        if not isinstance(exc, StarletteHTTPException):
            raise TypeError(f"http_error got {exc!r}")
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ApiError, api_error)
    # The proxy's own errors keep their OpenAI body (its route answers them itself).
    app.add_exception_handler(ProxyError, api_error)
    # One handler, one table: Starlette picks it for every subclass by the error's MRO.
    app.add_exception_handler(CtxcoreError, ctxcore_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    for kind in (redis.ConnectionError, redis.TimeoutError, SqlOperationalError, SqlTimeoutError):
        app.add_exception_handler(kind, unavailable)
