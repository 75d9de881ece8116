"""The stage journal: what each compaction stage run of a conversation did.

Every stage run (compressed, skipped, conflict, failed, rejected, paused, an internal error)
and every rollback appends one ``JournalEntry`` to its conversation's journal, which keeps
the newest ``JOURNAL_LIMIT`` entries. The journal lives with the conversation: under its
hash tag with its expiry on Redis (``ctxcore.state.redis.journal``), in a table of the
conversation's on SQL (``ctxcore.state.sql.journal``), and it is deleted with it.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from ctxcore.errors import StoreError
from ctxcore.state.keys import ConversationKey

__all__ = ["JOURNAL_LIMIT", "JournalEntry", "MemoryStageJournal", "StageJournal"]

JOURNAL_LIMIT = 200
"""Entries kept per conversation (the newest)."""


@dataclass(frozen=True)
class JournalEntry:
    """One stage run (or rollback) of a conversation.

    ``outcome``: ``compressed``, ``skipped``, ``conflict``, ``failed``, ``rejected``,
    ``paused`` (the tenant's summariser cap refused it), ``error`` (an unexpected failure)
    or ``rolled_back``. ``version``: the state version the run saved (None: nothing saved).
    ``error_message`` is already redacted and bounded by whoever built the entry.
    """

    stage: str
    outcome: str
    at: datetime
    tokens_before: int | None = None
    tokens_after: int | None = None
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    duration_ms: float = 0.0
    error_kind: str | None = None
    error_message: str | None = None
    version: int | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``at`` as ISO 8601)."""
        out = asdict(self)
        out["at"] = self.at.isoformat()
        return out

    def to_json(self) -> str:
        """The stored form."""
        return json.dumps(self.as_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> JournalEntry:
        """An entry from its stored form; ``StoreError`` when it is not one."""
        try:
            data = json.loads(raw)
            data["at"] = datetime.fromisoformat(data["at"])
            return cls(**data)
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(f"journal entry is not a stored entry: {str(raw)[:80]!r} ({exc})") from exc

    @staticmethod
    def now() -> datetime:
        """The time stamp of an entry written now."""
        return datetime.now(UTC)


@runtime_checkable
class StageJournal(Protocol):
    """A bounded per-conversation journal of stage runs (see the module docstring)."""

    def append(self, key: ConversationKey, entry: JournalEntry) -> None:
        """Add ``entry`` as the newest; entries past ``JOURNAL_LIMIT`` are dropped."""
        ...

    def entries(self, key: ConversationKey, limit: int = JOURNAL_LIMIT) -> list[JournalEntry]:
        """Up to ``limit`` entries, newest first."""
        ...

    def delete(self, key: ConversationKey) -> None:
        """Forget the conversation's journal."""
        ...


class MemoryStageJournal:
    """``StageJournal`` in a dict (one process; tests and the in-process engine)."""

    def __init__(self, limit: int = JOURNAL_LIMIT) -> None:
        self.limit = limit
        self._entries: dict[ConversationKey, deque[JournalEntry]] = {}
        self._lock = threading.Lock()

    def append(self, key: ConversationKey, entry: JournalEntry) -> None:
        """Add ``entry`` as the newest."""
        with self._lock:
            self._entries.setdefault(key, deque(maxlen=self.limit)).appendleft(entry)

    def entries(self, key: ConversationKey, limit: int = JOURNAL_LIMIT) -> list[JournalEntry]:
        """Up to ``limit`` entries, newest first."""
        with self._lock:
            return list(self._entries.get(key, ()))[: max(limit, 0)]

    def delete(self, key: ConversationKey) -> None:
        """Forget the conversation's journal."""
        with self._lock:
            self._entries.pop(key, None)
