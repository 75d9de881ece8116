"""``WindowReader``: every read of one window in one round trip to the store.

The fast path's seam over its stores: ``RedisWindowReader`` (``ctxcore.state.redis.window``)
and ``SqlWindowReader`` (``ctxcore.state.sql.window``) read the state, its pinned entries,
the tail after its cursor (newest first, as ``ctxcore.state.tail`` describes), the log's
end and, when the caller wants it, a recall index newer than the one it holds; each records
the window's budget, writing only when it changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ctxcore.messages import AnyMessage
from ctxcore.state.budget import BudgetTokens
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.tail import TailRead

__all__ = ["WindowRead", "WindowReader"]


@dataclass
class WindowRead:
    """What one window reads."""

    state: CompressionState | None
    pinned: list[AnyMessage]
    tail: TailRead
    # The compaction hash's fields (``workers.failures``: last error, backoff, mirrored
    # status) when the store holds them beside the conversation (Redis); None: not read.
    compaction: dict[str, str] | None = None
    # The key the compaction hash was read from (the caller checks it is its failure store's).
    compaction_key: str | None = None
    last_id: str | None = None
    # True when the conversation's expiry is more than an hour below its full retention.
    refresh_due: bool = False
    # The stored recall index when the caller's copy was older, else None.
    index: bytes | None = None


class WindowReader(Protocol):
    """Reads windows of one store (see the module docstring)."""

    def read(
        self,
        key: ConversationKey,
        budget_tokens: BudgetTokens,
        encoding: str,
        index_version: int | None = None,
    ) -> WindowRead:
        """The window's reads, counts under ``encoding``, recording ``budget_tokens`` (checked:
        ``ctxcore.state.budget``); ``index_version``: the recall index
        version the caller holds (None: recall off)."""
        ...

    def refresh(self, key: ConversationKey) -> None:
        """Give the conversation its full retention again (when ``refresh_due``)."""
        ...
