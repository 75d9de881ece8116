"""When the client retries: 429, 503 and connection errors, a bounded number of times."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ctxcore.errors import ConfigError, CtxcoreError, RateLimited, StoreUnavailable

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
