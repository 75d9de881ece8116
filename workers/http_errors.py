"""The HTTP API's error responses: ``ApiError``, the documented error codes and the handlers
that turn ctxcore's exceptions into ``{"error": <code>, "detail": ...}`` bodies."""

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
from ctxcore.errors import (
    BudgetExceeded,
    ConflictError,
    InvalidKeyError,
    InvalidMessageError,
    InvalidWindowError,
    RecallDisabled,
    StoreUnavailable,
    TruncateRefused,
)

__all__ = ["ApiError", "error_responses", "install_error_handlers", "invalid_message_error", "not_found"]

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


def _unavailable() -> JSONResponse:
    # Internal addresses and driver messages stay in the log, not in the response.
    return JSONResponse(
        {"error": "store_unavailable", "detail": "a store is unavailable; retry later"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def invalid_message(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidMessageError)
        return invalid_message_error(exc, "messages").response()

    async def budget_exceeded(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BudgetExceeded)
        return ApiError(
            422,
            "budget_exceeded",
            str(exc),
            budget=exc.budget,
            system_tokens=exc.system_tokens,
            tools_tokens=exc.tools_tokens,
            anchor_tokens=exc.anchor_tokens,
        ).response()

    async def conflict(_: Request, exc: Exception) -> JSONResponse:
        return ApiError(409, "conflict", str(exc)).response()

    async def truncate_refused(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TruncateRefused)
        last = exc.last_id
        return ApiError(
            409,
            "truncate_refused",
            str(exc),
            headers={"ETag": f'"{last}"'} if last else None,
            reason=exc.reason,
            last_id=last,
        ).response()

    async def recall_disabled(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RecallDisabled)
        return ApiError(409, "recall_disabled", str(exc), setting=exc.setting).response()

    async def invalid_window(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidWindowError)
        log.warning("not serving an invalid window: %s", exc)
        violations = [{"index": v.index, "rule": v.rule, "detail": v.detail} for v in exc.violations]
        return ApiError(
            409, "invalid_window", str(exc), state_version=exc.state_version, violations=violations
        ).response()

    async def invalid_key(_: Request, exc: Exception) -> JSONResponse:
        return not_found().response()

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable during %s %s: %s", request.method, request.url.path, exc)
        return _unavailable()

    async def invalid_request(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # Without "input": a validation error must not echo a (possibly large) body back.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return JSONResponse({"error": "invalid_request", "detail": errors}, status_code=422)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        # Unmatched routes (e.g. an id holding an encoded "/") and wrong methods: the same
        # {"error", "detail"} shape as every other error, not the framework's default body.
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(InvalidMessageError, invalid_message)
    app.add_exception_handler(BudgetExceeded, budget_exceeded)
    app.add_exception_handler(ConflictError, conflict)
    app.add_exception_handler(TruncateRefused, truncate_refused)
    app.add_exception_handler(RecallDisabled, recall_disabled)
    app.add_exception_handler(InvalidWindowError, invalid_window)
    app.add_exception_handler(InvalidKeyError, invalid_key)
    app.add_exception_handler(RequestValidationError, invalid_request)
    for kind in (
        StoreUnavailable,
        redis.ConnectionError,
        redis.TimeoutError,
        SqlOperationalError,
        SqlTimeoutError,
    ):
        app.add_exception_handler(kind, unavailable)
