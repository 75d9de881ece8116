"""The client's view of an error response: the ``CtxcoreError`` each status and code raises."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

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
    NotFoundError,
    OperationFailed,
    QuotaExceeded,
    RateLimited,
    RecallDisabled,
    StoreUnavailable,
    TruncateRefused,
    VersionNotKept,
)
from ctxcore.protocol import Violation

__all__ = ["ApiError", "error_for", "parse_retry_after"]


class ApiError(OperationFailed):
    """Any other error status of the HTTP API (e.g. a 500), with the body's code."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta seconds or an HTTP date (None if absent or unreadable)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


# The errors that carry the body's detail alone: by status and code, or by status ("": any code).
_DETAIL_ONLY: dict[tuple[int, str], type[CtxcoreError]] = {
    (403, ""): QuotaExceeded,
    (404, ""): NotFoundError,
    (409, "invalid_state"): CursorNotFoundError,
    (422, "invalid_config"): ConfigError,
    (422, "invalid_conversation_id"): InvalidKeyError,
}


def _build(status: int, code: str, body: Mapping[str, Any], retry_after: float | None) -> CtxcoreError:
    detail = str(body.get("detail", ""))
    detail_only = _DETAIL_ONLY.get((status, code)) or _DETAIL_ONLY.get((status, ""))
    if detail_only is not None:
        return detail_only(detail)
    if status == 401:
        return AuthenticationError(
            f"ctxcore rejected the bearer token: {detail}; check the token you configured"
        )
    if status == 409:
        last_id = body.get("last_id")
        if code == "truncate_refused":
            return TruncateRefused(str(body.get("reason") or "refused"), detail, last_id=last_id)
        if code == "recall_disabled":
            return RecallDisabled(str(body.get("setting") or "recall.enabled"))
        if code == "invalid_window":
            violations = [
                Violation(int(v.get("index", -1)), str(v.get("rule", "")), str(v.get("detail", "")))
                for v in body.get("violations") or []
            ]
            return InvalidWindowError(violations, int(body.get("state_version") or 0))
        if code == "version_not_kept":
            kept = [int(v) for v in body.get("kept") or []]
            return VersionNotKept(detail, version=int(body.get("version") or 0), kept=kept)
        return ConflictError(detail, last_id=last_id)
    if status == 413:
        return InvalidMessageError(-1, "body", detail)
    if status == 422:
        if code == "budget_exceeded":
            return BudgetExceeded(
                int(body.get("budget") or 0),
                int(body.get("system_tokens") or 0),
                int(body.get("tools_tokens") or 0),
                int(body.get("anchor_tokens") or 0),
            )
        index = body.get("index")
        field = body.get("field") or ("request" if code == "invalid_request" else "message")
        return InvalidMessageError(index if isinstance(index, int) else -1, str(field), detail)
    if status == 429:
        return RateLimited(f"rate limited: {detail}", retry_after=retry_after)
    if status == 503:
        return StoreUnavailable(f"ctxcore is unavailable: {detail}")
    return ApiError(f"HTTP {status} {code}: {detail}")


def error_for(status: int, body: Any, headers: Mapping[str, str]) -> CtxcoreError:
    """The error an error response means, with ``status`` and ``code`` (the body's ``error``) set."""
    fields: Mapping[str, Any] = body if isinstance(body, Mapping) else {"detail": str(body)}
    code = str(fields.get("error") or "http_error")
    error = _build(status, code, fields, parse_retry_after(headers.get("retry-after")))
    error.status = status
    error.code = code
    return error
