"""What a conversation's background compaction is doing, and how it last ended.

``CompactionStatus`` is the string windows and ``POST .../compact`` report: the scheduler's
``idle``/``queued``/``running``, ``failing`` while the last job ended with a failed stage
(until a later job succeeds), or ``paused`` while a job could not make progress
(``no_progress``) or the tenant's summariser budget is spent (``budget_exhausted``): no job
starts until what the ``Hold`` names changes. ``CompactionDetail`` is the why: the last
error, the time of the last success and the hold, as shown by ``GET .../state``, windows and
``ctxcore inspect``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Literal

__all__ = [
    "HOLD_REASONS",
    "PAUSE_REASONS",
    "CompactionDetail",
    "CompactionStatus",
    "Hold",
    "HoldReason",
    "LastError",
]

CompactionStatus = Literal["idle", "queued", "running", "failing", "paused"]

HoldReason = Literal["no_progress", "budget_exhausted", "newest_step"]
HOLD_REASONS: tuple[HoldReason, ...] = ("no_progress", "budget_exhausted", "newest_step")
PAUSE_REASONS: frozenset[str] = frozenset({"no_progress", "budget_exhausted"})
"""The reasons that make the status ``paused``; ``newest_step`` leaves it ``idle``."""


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
class Hold:
    """Why no compaction job starts for a conversation, and the sizes that say so.

    ``no_progress``: the last job's stages ran and saved nothing while the view stayed over
    its target. ``newest_step``: the view is over its target by its newest step (never
    summarised) and the anchors: no stage can help until another step arrives (status
    ``idle``). ``budget_exhausted``: the tenant's summariser tokens for the UTC ``day`` are
    spent (``used_tokens`` of ``cap_tokens``; ``needed_tokens`` is what the stage asked for).

    The sizes are tokens: ``view_tokens`` of the view as served, ``target_tokens`` its
    compaction target, ``budget_tokens`` the window budget asked for, ``held_tokens`` what may
    not be summarised (anchors and the newest step). ``last_id`` is the log's last id and
    ``at`` the time (UTC) the hold was recorded; windows re-arm from them.
    """

    reason: str
    at: datetime
    why: str
    view_tokens: int = 0
    target_tokens: int = 0
    budget_tokens: int = 0
    held_tokens: int = 0
    last_id: str | None = None
    used_tokens: int | None = None
    cap_tokens: int | None = None
    needed_tokens: int | None = None
    day: str | None = None

    @property
    def pauses(self) -> bool:
        """True when the hold makes the status ``paused`` (not ``newest_step``)."""
        return self.reason in PAUSE_REASONS

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, the time in ISO-8601."""
        out: dict[str, object] = asdict(self)
        out["at"] = self.at.isoformat()
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Hold:
        """The hold ``as_dict`` wrote (unknown keys ignored: a newer writer may add some)."""
        fields = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        fields["at"] = datetime.fromisoformat(str(raw["at"]))
        return cls(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CompactionDetail:
    """The last error (None after a success or when nothing failed), the last success time
    and the hold (None while jobs may start)."""

    last_error: LastError | None = None
    last_success_at: datetime | None = None
    hold: Hold | None = None

    @property
    def reason(self) -> str | None:
        """The hold's reason (``no_progress``, ``budget_exhausted``, ``newest_step``), else None."""
        return self.hold.reason if self.hold is not None else None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, times in ISO-8601."""
        return {
            "last_error": self.last_error.as_dict() if self.last_error else None,
            "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
            "reason": self.reason,
            "hold": self.hold.as_dict() if self.hold else None,
        }
