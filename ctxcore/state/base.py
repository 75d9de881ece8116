"""The storage seams: ``StateStore``, ``MessageLog`` and ``OffloadStore`` protocols."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ctxcore.errors import InvalidKeyError, InvalidMessageError, StoreError
from ctxcore.messages import AnyMessage, messages_from_json
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState

__all__ = [
    "HISTORY_LIMIT",
    "LOG_ID_WIDTH",
    "MessageLog",
    "OffloadStore",
    "StateStore",
    "check_budget",
    "check_loggable",
    "decode_log_messages",
    "encode_log_message",
    "encode_state",
    "format_log_id",
    "parse_log_id",
    "rollback_by_save",
]

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


# --- helpers shared by the backends ---------------------------------------------------------

LOG_ID_WIDTH = 12
"""Digits of a log id: a zero-padded per-conversation counter, so string order is append order."""


def format_log_id(seq: int) -> str:
    """The log id of the ``seq``-th message of a conversation (1-based)."""
    return f"{seq:0{LOG_ID_WIDTH}d}"


def parse_log_id(log_id: str) -> int:
    """The counter value behind ``log_id``; ``InvalidKeyError`` if it is not a log id."""
    if (
        not isinstance(log_id, str)
        or len(log_id) != LOG_ID_WIDTH
        or not log_id.isascii()
        or not log_id.isdigit()
    ):
        raise InvalidKeyError(f"invalid log id {log_id!r}: expected {LOG_ID_WIDTH} ASCII digits")
    return int(log_id)


def check_loggable(messages: Sequence[AnyMessage]) -> None:
    """Reject a batch containing a system message before anything of it is written."""
    for index, message in enumerate(messages):
        if message.role == "system":
            raise InvalidMessageError(
                index, "role", "system messages are not logged: send them with each window request"
            )


def encode_log_message(message: AnyMessage) -> str:
    """JSON of one logged message, without its log id (the store assigns and re-attaches it)."""
    return message.model_dump_json(exclude={"context_message_id"})


def decode_log_messages(rows: Sequence[tuple[str, str | bytes]]) -> list[AnyMessage]:
    """Messages from ``(log id, encode_log_message output)`` rows, ``context_message_id`` set."""
    if not rows:
        return []
    # One JSON array and one validation pass for the whole page rather than one per message.
    parts = [raw.encode() if isinstance(raw, str) else raw for _, raw in rows]
    messages = messages_from_json(b"[" + b",".join(parts) + b"]")
    return [
        m.model_copy(update={"context_message_id": log_id})
        for (log_id, _), m in zip(rows, messages, strict=True)
    ]


def encode_state(state: CompressionState, version: int) -> str:
    """JSON of ``state`` as stored under ``version`` (the store, not the caller, numbers versions)."""
    return state.model_copy(update={"version": version}).model_dump_json()


def check_budget(budget_tokens: int) -> None:
    """A budget must be a positive number of tokens (``ValueError`` otherwise)."""
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1:
        raise ValueError(f"budget_tokens must be a positive integer, got {budget_tokens!r}")


def rollback_by_save(store: StateStore, key: ConversationKey, to_version: int, expected_version: int) -> bool:
    """``StateStore.rollback`` on top of ``history`` and ``save``.

    Safe without a lock: kept versions are never rewritten, and ``save`` re-checks
    ``expected_version`` atomically, so a writer that slipped in between makes it return False.
    Raises ``StoreError`` when ``to_version`` is not among the kept versions.
    """
    kept = store.history(key)
    if not kept or kept[0].version != expected_version:
        return False
    for state in kept:
        if state.version == to_version:
            return store.save(key, state, expected_version)
    raise StoreError(
        f"{key}: version {to_version} is not kept (kept: {kept[-1].version}..{kept[0].version}, "
        f"the last {HISTORY_LIMIT}); pick one of those"
    )
