"""What each error answers over HTTP: ``ERROR_STATUSES``, the one table giving each
``CtxcoreError`` subclass one status, code, detail, extra body fields and headers.
``workers.http.errors`` answers with it in ctxcore's ``{"error": <code>, "detail": ...}``
body, the proxy (``workers.proxy.errors``) in OpenAI's for the errors it has no rule of its
own for; both read it from here, below both."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxcore.client.errors import ApiError as ClientApiError
from ctxcore.errors import (
    AuthenticationError,
    BudgetExceeded,
    ConfigError,
    ConflictError,
    CtxcoreError,
    CursorNotFoundError,
    InvalidKeyError,
    InvalidMessageError,
    InvalidRequestError,
    InvalidWindowError,
    ModelError,
    NotFoundError,
    OperationFailed,
    QuotaExceeded,
    RateLimited,
    RecallDisabled,
    StoreError,
    StoreUnavailable,
    TruncateRefused,
    UnsupportedItemError,
    UsageError,
    VersionNotKept,
)
from ctxcore.pipeline.fitting import CallTooLarge
from ctxcore.summarize.errors import ModelCallError
from workers.circuit import CircuitOpenError
from workers.failures import StageFailedError
from workers.locks import ConversationBusy
from workers.spend import SummariserBudgetExhausted

__all__ = ["ERROR_STATUSES", "STORE_DOWN", "ErrorStatus", "error_status"]


def _no_fields(_: Any) -> dict[str, Any]:
    return {}


def _no_headers(_: Any) -> dict[str, str] | None:
    return None


@dataclass(frozen=True)
class ErrorStatus:
    """How one error class is answered: status, body code, the body's detail and extra
    fields, headers, and whether the server logs it (failures of the server's side)."""

    status: int
    code: str
    detail: Callable[[Any], str] = str
    fields: Callable[[Any], dict[str, Any]] = _no_fields
    headers: Callable[[Any], dict[str, str] | None] = _no_headers
    logged: bool = False


def _masked(text: str) -> Callable[[Any], str]:
    # Driver messages and internal addresses stay in the server's log, out of the response.
    return lambda _: text


def _retry_after(seconds: float | None) -> dict[str, str]:
    return {"Retry-After": str(max(math.ceil(seconds or 1), 1))}


STORE_DOWN = ErrorStatus(
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
    UsageError: ErrorStatus(400, "ctxcore_error"),
    # Something the request needs failed or refused now: retry later (the detail is logged).
    OperationFailed: ErrorStatus(
        503, "unavailable", _masked("ctxcore could not complete it now; retry later"), logged=True
    ),
    InvalidMessageError: _INVALID_MESSAGE,
    InvalidRequestError: ErrorStatus(422, "invalid_request", fields=lambda x: {"field": x.field}),
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
    # An append's If-Match mismatch names the log's last id (body and ETag) to retry against.
    ConflictError: ErrorStatus(
        409,
        "conflict",
        fields=lambda x: {"last_id": x.last_id} if x.expected_last_id is not None else {},
        headers=lambda x: (
            {"ETag": f'"{x.last_id}"'} if x.expected_last_id is not None and x.last_id else None
        ),
    ),
    ConversationBusy: ErrorStatus(409, "conversation_busy", headers=lambda _: {"Retry-After": "1"}),
    TruncateRefused: ErrorStatus(
        409,
        "truncate_refused",
        fields=lambda x: {"reason": x.reason, "last_id": x.last_id},
        headers=lambda x: {"ETag": f'"{x.last_id}"'} if x.last_id else None,
    ),
    RecallDisabled: ErrorStatus(409, "recall_disabled", fields=lambda x: {"setting": x.setting}),
    VersionNotKept: ErrorStatus(
        409, "version_not_kept", fields=lambda x: {"version": x.version, "kept": x.kept}
    ),
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
    StoreUnavailable: STORE_DOWN,
    StoreError: ErrorStatus(502, "store_error", _masked("a store failed; see the server log"), logged=True),
    ModelError: _MODEL_FAILED,
    ModelCallError: _MODEL_FAILED,
    # Raised in stages only (the call does not fit model.context_window_tokens).
    CallTooLarge: _MODEL_FAILED,
    StageFailedError: _MODEL_FAILED,
    CircuitOpenError: ErrorStatus(
        503,
        "circuit_open",
        _masked("the summarisation endpoint's circuit is open; retry later"),
        headers=lambda x: _retry_after(x.retry_after),
    ),
    ClientApiError: _UPSTREAM,
    # Raised in workers only (a stage pauses its conversation); listed so the table is whole.
    SummariserBudgetExhausted: ErrorStatus(429, "summariser_budget_exhausted"),
}


def error_status(exc: CtxcoreError) -> ErrorStatus:
    """The table's entry for ``exc``: its class's, else its nearest listed base's."""
    for kind in type(exc).__mro__:
        if kind in ERROR_STATUSES:
            return ERROR_STATUSES[kind]
    return ERROR_STATUSES[CtxcoreError]
