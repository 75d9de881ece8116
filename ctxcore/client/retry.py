"""When the client retries: 429, 503 and connection errors, a bounded number of times."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from ctxcore.client.errors import error_for, parse_retry_after
from ctxcore.errors import ConfigError, CtxcoreError, RateLimited, StoreUnavailable

if TYPE_CHECKING:
    from ctxcore.client.calls import Call

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """Up to ``max_retries`` retries; each waits the server's ``Retry-After`` when it sent one,
    else an exponential backoff from ``backoff_seconds`` with full jitter, never more than
    ``max_retry_wait`` (a ``Retry-After`` above it raises at once: nobody waits an hour)."""

    max_retries: int = 3
    max_retry_wait: float = 30.0
    backoff_seconds: float = 0.5
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ConfigError(f"client max_retries must be >= 0, got {self.max_retries}")
        if self.max_retry_wait <= 0 or self.backoff_seconds <= 0:
            raise ConfigError("client max_retry_wait and backoff_seconds must be positive")

    @staticmethod
    def retryable(error: CtxcoreError) -> bool:
        """429 and 503 are worth retrying; every other status is not."""
        return isinstance(error, RateLimited | StoreUnavailable)

    def wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number ``attempt + 1`` (0-based), or None to give up."""
        if attempt >= self.max_retries:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_wait else None
        ceiling = min(self.max_retry_wait, self.backoff_seconds * 2**attempt)
        return self.rng.uniform(ceiling / 2, ceiling)

    def after_failure(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any], attempt: int, exc: Exception
    ) -> float:
        """Seconds to wait after a connection error on ``attempt``; ``StoreUnavailable`` when
        no retry is left."""
        wait = self.wait(attempt, None)
        if wait is None:
            raise StoreUnavailable(
                f"ctxcore at {http.base_url} did not answer {call.method} {call.path} "
                f"after {attempt + 1} attempt(s): {exc!r}"
            ) from exc
        log.warning("%s %s: %r; retrying in %.2f s", call.method, call.path, exc, wait)
        return wait

    def settle(self, call: Call[T], response: httpx.Response, attempt: int) -> tuple[T] | float:
        """The call's result as a 1-tuple, or the seconds to wait before retrying; the
        response's ``CtxcoreError`` when it is not retried."""
        if response.is_success:
            return (call.parse(response),)
        if attempt > 0 and call.accept is not None and (landed := call.accept(response)) is not None:
            return landed
        error = error_for(response.status_code, _body(response), response.headers)
        wait = self.wait(attempt, parse_retry_after(response.headers.get("retry-after")))
        if not self.retryable(error) or wait is None:
            raise error
        log.warning("%s %s: HTTP %d; retrying in %.2f s", call.method, call.path, response.status_code, wait)
        return wait


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}
