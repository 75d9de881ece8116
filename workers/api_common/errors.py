"""``ApiError``, the error response a route raises (``{"error": <code>, "detail": ...}`` plus
code-specific fields), and the ones several routes raise alike."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ctxcore.errors import InvalidMessageError

__all__ = ["ApiError", "invalid_message_error", "not_found"]


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
    """The 404 of an unknown conversation (or other resource ``what``)."""
    # The same body for unknown, invalid and foreign ids: nothing is revealed.
    return ApiError(404, "not_found", f"{what} not found")


def invalid_message_error(exc: InvalidMessageError, location: str) -> ApiError:
    """The 422 naming the invalid message's index and field, and where it was (``location``)."""
    return ApiError(422, "invalid_message", exc.detail, index=exc.index, field=exc.field, location=location)
