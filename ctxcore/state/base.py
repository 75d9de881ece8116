"""The storage seams: ``StateStore``, ``MessageLog`` and ``OffloadStore`` protocols."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ctxcore.errors import (
    ConflictError,
    CursorNotFoundError,
    InvalidMessageError,
    StoreError,
    TruncateRefused,
)
from ctxcore.messages import AnyMessage, messages_from_json
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite
from ctxcore.state.budget import MAX_BUDGET_TOKENS, BudgetTokens, check_budget
from ctxcore.state.keys import ConversationKey
from ctxcore.state.log_ids import LOG_ID_WIDTH, expected_seq, format_log_id, parse_log_id, replayed_ids
from ctxcore.state.models import CompressionState
from ctxcore.state.tail import CountedLog
from ctxcore.state.undecodable import decode_entries
from ctxcore.state.window_read import WindowReader

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "HISTORY_LIMIT",
    "LOG_ID_WIDTH",
    "MAX_BUDGET_TOKENS",
    "ArchiveKeeper",
    "BudgetTokens",
    "FileKeeper",
    "LogOverview",
    "MessageLog",
    "OffloadStore",
    "StateStore",
    "append_conflict",
    "check_budget",
    "check_loggable",
    "check_pinned",
    "decode_log_messages",
    "encode_log_message",
    "encode_state",
    "expected_seq",
    "format_log_id",
    "loaded_cursor",
    "message_by_id",
    "newest_state",
    "parse_log_id",
    "read_pinned",
    "replayed_ids",
    "rollback_by_save",
    "truncate_moved",
]

HISTORY_LIMIT = 20


@dataclass(frozen=True)
class LogOverview:
    """A log's figures the store keeps beside it (read without reading any entry).

    ``tokens``: the counted run's running total under ``encoding`` when that run covers the
    whole log (0 for an empty log); None when some entries were logged without stored counts
    (counting them would mean reading them). ``last_active``: epoch seconds of the last
    activity the store stamped (the retention's clock); None when it keeps none (Redis
    without a retention, the memory log).
    """

    tokens: int | None
    encoding: str | None
    last_active: float | None


@runtime_checkable
class StateStore(Protocol):
    """Versioned compaction state with compare-and-swap saves.

    Broken infrastructure raises ``StoreUnavailable`` (cause chained); a lost race is a
    ``False`` result, never an exception and never an overwrite.
    """

    def load(self, key: ConversationKey) -> CompressionState | None:
        """The current state, or None if nothing was saved."""
        ...

    def cursor(self, key: ConversationKey) -> str | None:
        """The current state's ``covered_until`` without the state (an append validates its
        messages against the log after it): None without a state or when it covers nothing."""
        ...

    def save(
        self,
        key: ConversationKey,
        state: CompressionState,
        expected_version: int,
        archive: ArchiveWrite | None = None,
    ) -> bool:
        """Store ``state`` as version ``expected_version + 1`` iff the current version is
        ``expected_version`` (0 = none yet). False when another writer saved first.

        With ``archive``, its chunks and index are written in the same atomic step: a lost
        race writes neither, a failed write fails the save.
        """
        ...

    def load_archive(self, key: ConversationKey) -> bytes | None:
        """The conversation's recall index as stored (``RecallIndex.to_bytes``), or None."""
        ...

    def archive_chunks(self, key: ConversationKey) -> list[ArchiveChunk]:
        """Every archived chunk of the conversation, in log order."""
        ...

    def history(self, key: ConversationKey, limit: int = HISTORY_LIMIT) -> list[CompressionState]:
        """The most recent saved versions, newest first (the last 20 are kept)."""
        ...

    def rollback(self, key: ConversationKey, to_version: int, expected_version: int) -> bool:
        """Save a copy of kept version ``to_version`` as a new version, with CAS on ``expected_version``."""
        ...

    def delete(self, key: ConversationKey) -> None:
        """Remove the state, its history, its budget and its recall archive."""
        ...

    def get_budget(self, key: ConversationKey) -> int | None:
        """The conversation's budget as the last window recorded it: the room that window left
        the messages, the requested budget less its system messages and tools
        (``conversation_budget``; kept beside the state, not versioned)."""
        ...

    def set_budget(self, key: ConversationKey, budget_tokens: int) -> None:
        """Record the conversation's budget (a plain write, no version bump);
        ``InvalidRequestError`` for an ``int`` that is no budget (``check_budget``)."""
        ...

    def window_reader(self, log: MessageLog) -> WindowReader | None:
        """The reader of windows over this store and ``log`` in one round trip, when ``log`` is
        this store's sibling (same database and prefix); None: read the stores one by one."""
        ...


@runtime_checkable
class MessageLog(Protocol):
    """The raw, append-only history of each conversation.

    Log ids are fixed-width strings whose string order is append order.
    """

    def append(
        self, key: ConversationKey, messages: Sequence[AnyMessage], *, expected_last_id: str | None = None
    ) -> list[str]:
        """Append messages atomically, returning their log ids.

        A message whose ``message_id`` is already in the log is not appended again and gets
        its existing id back. System messages are rejected (they come with each window
        request). With ``expected_last_id`` the batch is appended only if the log ends at
        that id, checked in the same atomic step as the write; otherwise ``ConflictError``
        carrying the log's ``last_id``. A replay of a call that succeeded is recognised and
        returns its ids: every message has a logged ``message_id`` and the ids above
        ``expected_last_id`` run consecutively right after it (see ``replayed_ids``).
        """
        ...

    def read_after(
        self, key: ConversationKey, cursor: str | None, limit: int | None = None
    ) -> list[AnyMessage]:
        """Messages with log id > ``cursor`` (all when None), oldest first, ids set."""
        ...

    def read_newest(self, key: ConversationKey, cursor: str | None, limit: int) -> list[AnyMessage]:
        """The newest ``limit`` messages with log id > ``cursor`` (all when None), oldest first:
        what an append is validated after, in one read (no ``last_id`` first)."""
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

    def truncate_after(
        self, key: ConversationKey, log_id: str, *, expected_last_id: str | None = None
    ) -> list[str]:
        """Remove every message with a log id above ``log_id``; their ids, oldest first.

        The append-only log's one exception, for a client taking back its newest messages
        (an Agents SDK ``pop_item``). Atomic with respect to appends; ids are never reused
        (the next append continues after the highest id ever assigned) and the removed
        messages' ``message_id``s are forgotten, so they can be appended again. With
        ``expected_last_id`` nothing is removed unless the log ends there
        (``TruncateRefused``, reason ``moved``). The log does not know the compaction state:
        callers hold the conversation's lock and refuse when a compaction covers a message
        above ``log_id`` (``ContextService.truncate_after``, ``ModelContext.truncate_after``).
        ``format_log_id(0)`` empties the log; ``last_id`` is then None.
        """
        ...

    def list_conversations(self, tenant_id: str, after: str | None = None, limit: int = 100) -> list[str]:
        """Conversation ids of a tenant in id order, after ``after`` (paging)."""
        ...

    def overview(self, key: ConversationKey) -> LogOverview:
        """What a listing shows of the log without reading its entries (``LogOverview``)."""
        ...

    def counted(self) -> CountedLog | None:
        """This log as a ``CountedLog`` when it stores token counts (else None)."""
        ...


class ArchiveKeeper(Protocol):
    """A store that also keeps a context's recall index (``FilesystemOffloadStore`` does)."""

    def put_archive(self, key: ConversationKey, data: bytes) -> None:
        """Replace the stored index."""
        ...

    def get_archive(self, key: ConversationKey) -> bytes | None:
        """The stored index, or None."""
        ...


class FileKeeper(ArchiveKeeper, Protocol):
    """An offload store that keeps files (``FilesystemOffloadStore``): offload markers name
    each file, and a context's recall index is kept beside them."""

    def path_for(self, key: ConversationKey, handle: str) -> Path:
        """Where ``handle``'s file lives (whether or not it exists)."""
        ...


class OffloadStore(Protocol):
    """Original messages removed from a view, kept behind a handle so they can be reloaded."""

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Store ``messages`` under ``handle``; False (and no write) if the handle exists."""
        ...

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        """``put_if_absent`` of each (handle, messages) in order, in one call (the fast path
        offloads every cleared result of a window at once); a handle repeated in ``items`` is
        written once (its first messages)."""
        ...

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None for an unknown handle."""
        ...

    def delete(self, key: ConversationKey) -> None:
        """Remove every offload of the conversation."""
        ...

    def files(self) -> FileKeeper | None:
        """This store as one that keeps files (None: offloads are addressed by handle only)."""
        ...


# --- helpers shared by the backends ---------------------------------------------------------


def truncate_moved(key: ConversationKey, expected_last_id: str, last_seq: int) -> TruncateRefused:
    """The ``TruncateRefused`` of a truncation whose ``expected_last_id`` is not where the log ends."""
    last = format_log_id(last_seq) if last_seq > 0 else None
    return TruncateRefused(
        "moved",
        f"{key}: expected the log to end at {expected_last_id!r}, it ends at {last!r}; nothing removed",
        last_id=last,
    )


def append_conflict(key: ConversationKey, expected_last_id: str | None, last_seq: int) -> ConflictError:
    """The ``ConflictError`` of an append whose ``expected_last_id`` is not where the log ends."""
    last = format_log_id(last_seq) if last_seq > 0 else None
    return ConflictError(
        f"{key}: expected the log to end at {expected_last_id!r}, it ends at {last!r}; read the log "
        "(or take the returned last id) and retry",
        last_id=last,
        expected_last_id=expected_last_id,
    )


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
    """Messages from ``(log id, encode_log_message output)`` rows, ``context_message_id`` set.

    An entry that no longer decodes is never fatal: it is read as its placeholder
    (``ctxcore.state.undecodable``), the others as they were stored.
    """
    if not rows:
        return []
    # One JSON array and one validation pass for the whole page rather than one per message,
    # the log id spliced into each object first: a model_copy per message to attach it cost
    # a tenth of a window's time.
    parts: list[bytes | None] = []
    reasons: list[str] = []
    for log_id, raw in rows:
        body = (raw.encode() if isinstance(raw, str) else raw).strip()
        if body[:1] != b"{" or body[-1:] != b"}" or body[1:-1].strip() == b"":
            parts.append(None)
            reasons.append(f"not a stored message: {body[:80]!r}")
            continue
        # Last, so it wins over any id an older writer stored (as the copy's update did).
        parts.append(body[:-1] + b',"context_message_id":' + json.dumps(log_id).encode() + b"}")
        reasons.append("")
    if all(p is not None for p in parts):
        try:
            return messages_from_json(b"[" + b",".join(p for p in parts if p is not None) + b"]")
        except ValueError:  # pydantic's ValidationError: one entry or more; find them
            pass
    return decode_entries([log_id for log_id, _ in rows], parts, reasons)


def encode_state(state: CompressionState, version: int) -> str:
    """JSON of ``state`` as stored under ``version`` (the store, not the caller, numbers versions)."""
    return state.model_copy(update={"version": version}).model_dump_json()


def check_pinned(key: ConversationKey, state: CompressionState | None, found: Sequence[AnyMessage]) -> None:
    """``CursorNotFoundError`` when a log id ``state`` pins is not among the messages read for
    it, as the Coordinator raises: never a window without an anchor. An entry that is in the
    log but no longer decodes was read (as its placeholder): the undecodable rule leaves it out."""
    ids = {m.context_message_id for m in found}
    for log_id in state.pinned if state is not None else ():
        if log_id not in ids:
            raise CursorNotFoundError(
                f"{key}: pinned message {log_id!r} is missing from the log; inspect the state "
                "history and roll back, or delete the conversation"
            )


def read_pinned(log: MessageLog, key: ConversationKey, state: CompressionState) -> list[AnyMessage]:
    """The messages ``state`` pins, read one by one (``check_pinned``)."""
    found = [m for m in (log.get(key, i) for i in state.pinned) if m is not None]
    check_pinned(key, state, found)
    return found


def newest_state(store: StateStore, key: ConversationKey) -> CompressionState | None:
    """``StateStore.load`` on top of ``history``: the newest kept version, or None."""
    return next(iter(store.history(key, 1)), None)


def loaded_cursor(store: StateStore, key: ConversationKey) -> str | None:
    """The current state's ``covered_until`` read from the state itself (None without one)."""
    return next((state.covered_until for state in store.history(key, 1)), None)


def message_by_id(log: MessageLog, key: ConversationKey, log_id: str) -> AnyMessage | None:
    """``MessageLog.get`` on top of ``read_range``: one message, or None."""
    return next(iter(log.read_range(key, log_id, log_id)), None)


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
