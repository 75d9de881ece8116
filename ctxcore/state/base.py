"""The storage seams: ``StateStore``, ``MessageLog`` and ``OffloadStore`` protocols."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ctxcore.messages import AnyMessage
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState

__all__ = ["HISTORY_LIMIT", "MessageLog", "OffloadStore", "StateStore"]

HISTORY_LIMIT = 20


@runtime_checkable
class StateStore(Protocol):
    """Versioned compaction state with compare-and-swap saves.

    Broken infrastructure raises ``StoreUnavailable`` (cause chained); a lost race is a
    ``False`` result, never an exception and never an overwrite.
    """

    def load(self, key: ConversationKey) -> CompressionState | None:
        """The current state, or None if nothing was saved."""
        ...

    def save(self, key: ConversationKey, state: CompressionState, expected_version: int) -> bool:
        """Store ``state`` as version ``expected_version + 1`` iff the current version is
        ``expected_version`` (0 = none yet). False when another writer saved first."""
        ...

    def history(self, key: ConversationKey, limit: int = HISTORY_LIMIT) -> list[CompressionState]:
        """The most recent saved versions, newest first (the last 20 are kept)."""
        ...

    def rollback(self, key: ConversationKey, to_version: int, expected_version: int) -> bool:
        """Save a copy of kept version ``to_version`` as a new version, with CAS on ``expected_version``."""
        ...

    def delete(self, key: ConversationKey) -> None:
        """Remove the state, its history and its budget."""
        ...

    def get_budget(self, key: ConversationKey) -> int | None:
        """The token budget a client last asked for (kept beside the state, not versioned)."""
        ...

    def set_budget(self, key: ConversationKey, budget_tokens: int) -> None:
        """Record the budget a client asked for (a plain write, no version bump)."""
        ...


@runtime_checkable
class MessageLog(Protocol):
    """The raw, append-only history of each conversation.

    Log ids are fixed-width strings whose string order is append order.
    """

    def append(self, key: ConversationKey, messages: Sequence[AnyMessage]) -> list[str]:
        """Append messages, returning their log ids. A message whose ``message_id`` is
        already in the log is not appended again and gets its existing id back. System
        messages are rejected (they come with each window request)."""
        ...

    def read_after(
        self, key: ConversationKey, cursor: str | None, limit: int | None = None
    ) -> list[AnyMessage]:
        """Messages with log id > ``cursor`` (all when None), oldest first, ids set."""
        ...

    def read_range(self, key: ConversationKey, first: str, last: str) -> list[AnyMessage]:
        """Messages with ``first <= log id <= last``."""
        ...

    def get(self, key: ConversationKey, log_id: str) -> AnyMessage | None:
        """One message by log id."""
        ...

    def last_id(self, key: ConversationKey) -> str | None:
        """The newest log id, or None for an empty conversation."""
        ...

    def delete(self, key: ConversationKey) -> None:
        """Remove the conversation's log."""
        ...

    def list_conversations(self, tenant_id: str, after: str | None = None, limit: int = 100) -> list[str]:
        """Conversation ids of a tenant in id order, after ``after`` (paging)."""
        ...


@runtime_checkable
class OffloadStore(Protocol):
    """Original messages removed from a view, kept behind a handle so they can be reloaded."""

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Store ``messages`` under ``handle``; False (and no write) if the handle exists."""
        ...

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None for an unknown handle."""
        ...

    def delete(self, key: ConversationKey) -> None:
        """Remove every offload of the conversation."""
        ...
