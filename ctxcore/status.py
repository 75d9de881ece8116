"""What a conversation's background compaction is doing, and how it last ended.

``CompactionStatus`` is the string windows and ``POST .../compact`` report: the scheduler's
``idle``/``queued``/``running``, or ``failing`` while the last job ended with a failed stage
(until a later job succeeds). ``CompactionDetail`` is the why: the last error and the time of
the last success, as shown by ``GET .../state``, windows and ``ctxcore inspect``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

__all__ = ["CompactionDetail", "CompactionStatus", "LastError"]

CompactionStatus = Literal["idle", "queued", "running", "failing"]


@dataclass(frozen=True)
class LastError:
    """The failure that ended a stage for good.

    ``kind`` is the model error kind (``rate_limit``, ``authentication``, ...),
    ``store_unavailable`` for a store outage that outlasted the retries, or ``internal`` for
    an unclassified exception (a bug), whose ``message`` is its class and text. ``stage`` is
    the stage kind (None when planning failed before any stage). ``at`` is UTC.
    """

    kind: str
    message: str
    stage: str | None
    at: datetime

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready, the time in ISO-8601."""
        return {"kind": self.kind, "message": self.message, "stage": self.stage, "at": self.at.isoformat()}


@dataclass(frozen=True)
class CompactionDetail:
    """The last error (None after a success or when nothing failed) and the last success time."""

    last_error: LastError | None = None
    last_success_at: datetime | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, times in ISO-8601."""
        return {
            "last_error": self.last_error.as_dict() if self.last_error else None,
            "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
        }
