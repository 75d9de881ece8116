"""OpenAI-style error bodies for everything the proxy answers itself:
``{"error": {"message", "type", "param", "code"}}``.

The proxy route never lets a ctxcore error reach the app's ctxcore-shaped handlers:
``openai_error`` turns each into the response an OpenAI client understands
(``BudgetExceeded`` is a 400 ``context_length_exceeded`` here, a 422 on the ctxcore API; the
errors it has no rule for get the ctxcore API's status and code, ``ERROR_STATUSES``).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError as SqlOperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

from ctxcore.errors import (
    BudgetExceeded,
    CtxcoreError,
    InvalidMessageError,
    InvalidWindowError,
    StoreUnavailable,
)
from workers.api_common.error_statuses import error_status
from workers.api_common.errors import ApiError

__all__ = [
    "OpenAIErrorResponse",
    "ProxyError",
    "install_proxy_error_handler",
    "openai_error",
    "proxy_responses",
]

log = logging.getLogger(__name__)

OUTAGES = (StoreUnavailable, redis.ConnectionError, redis.TimeoutError, SqlOperationalError, SqlTimeoutError)

_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class OpenAIError(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    """The body of every error the proxy answers itself."""

    error: OpenAIError


def proxy_responses() -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of ``POST /v1/chat/completions``."""
    text = {
        400: "Invalid request, history_diverged, context_length_exceeded, unknown model window",
        401: "Missing or invalid bearer token (a ctxcore token)",
        403: "The tenant's conversation limit is reached",
        404: "No upstream configured for the tenant (proxy_not_configured)",
        409: "The conversation's saved state cannot be served (invalid_window)",
        429: "Rate limited (see Retry-After)",
        502: "The upstream refused the connection or broke off",
        503: "A store is unavailable (see Retry-After)",
        504: "The upstream did not answer within proxy.upstream_timeout",
    }
    return {
        **{code: {"model": OpenAIErrorResponse, "description": about} for code, about in text.items()},
        200: {
            "description": "The upstream's chat completion (a JSON body, or server-sent events when streamed)",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        },
        413: {
            "model": OpenAIErrorResponse,
            "description": "Request body over http.max_body_bytes (checked before any parsing; the limit in the message)",
        },
        "default": {
            "model": OpenAIErrorResponse,
            "description": "An upstream error: its status, code, type and param, its message redacted",
        },
    }


class ProxyError(CtxcoreError):
    """An error the proxy answers with, in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        *,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status
        self.code = code
        self.message = message
        self.param = param
        self.type = (
            type_ or _TYPES.get(status) or ("server_error" if status >= 500 else "invalid_request_error")
        )
        self.headers = headers

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status_code, headers=self.headers)


def install_proxy_error_handler(app: FastAPI) -> None:
    """Answer a ``ProxyError`` that leaves the proxy's route with its own OpenAI body (else the
    app's ``CtxcoreError`` handler would answer it in ctxcore's shape)."""

    @app.exception_handler(ProxyError)
    async def proxy_error(_: Request, exc: ProxyError) -> JSONResponse:
        return exc.response()


def openai_error(exc: Exception, offset: int = 0) -> JSONResponse | None:
    """The OpenAI-style response for an expected exception, else None (re-raise it).

    ``offset`` maps an ``InvalidMessageError``'s index among the appended messages to the
    request's ``messages`` index.
    """
    if isinstance(exc, ProxyError):
        return exc.response()
    if isinstance(exc, ApiError):  # authentication and rate limiting
        return ProxyError(exc.status, exc.detail, exc.error, headers=exc.headers).response()
    if isinstance(exc, BudgetExceeded):
        return ProxyError(400, str(exc), "context_length_exceeded", param="messages").response()
    if isinstance(exc, InvalidMessageError):
        index = exc.index + offset if exc.index >= 0 else exc.index
        param = f"messages[{index}].{exc.field}" if index >= 0 else "messages"
        return ProxyError(
            400, str(exc).replace(f"message {exc.index}:", f"message {index}:"), exc.field, param=param
        ).response()
    if isinstance(exc, InvalidWindowError):
        log.warning("proxy: not serving an invalid window: %s", exc)
        # Retrying cannot help (the saved state is at fault): tell the SDK not to.
        return ProxyError(409, str(exc), "invalid_window", headers={"x-should-retry": "false"}).response()
    if isinstance(exc, OUTAGES):
        log.warning("proxy: store unavailable: %s", exc)
        return ProxyError(
            503, "a store is unavailable; retry later", "store_unavailable", headers={"Retry-After": "1"}
        ).response()
    if isinstance(exc, CtxcoreError):
        # Any other error of the core: the ctxcore API's status and code, in OpenAI's body.
        entry = error_status(exc)
        if entry.logged:
            log.warning("proxy: %s %s: %s", entry.status, entry.code, exc)
        return ProxyError(entry.status, entry.detail(exc), entry.code, headers=entry.headers(exc)).response()
    return None
