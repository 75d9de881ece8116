"""In-process backends: as correct as the others (locks, CAS, dedupe), not durable.

States and log messages are kept as the same JSON the durable backends write, so what one
backend accepts and returns, the others do too (and a caller cannot mutate stored data).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ctxcore.messages import AnyMessage
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite, decode_chunk, encode_chunk
from ctxcore.state.base import (
    HISTORY_LIMIT,
    LogOverview,
    MessageLog,
    append_conflict,
    check_loggable,
    decode_log_messages,
    encode_log_message,
    encode_state,
    expected_seq,
    format_log_id,
    loaded_cursor,
    message_by_id,
    newest_state,
    parse_log_id,
    replayed_ids,
    rollback_by_save,
    truncate_moved,
)
from ctxcore.state.budget import check_budget
from ctxcore.state.keys import ConversationKey, listing_wanted
from ctxcore.state.memory_offload import MemoryOffloadStore
from ctxcore.state.models import CompressionState
from ctxcore.state.tail import AppendCounts, CountedLog, TailRead, check_counts, plan_tail
from ctxcore.state.window_read import WindowReader

__all__ = ["MemoryMessageLog", "MemoryOffloadStore", "MemoryStateStore"]


class MemoryStateStore:
    """Versioned compaction states in a dict; ``save`` is compare-and-swap under a lock."""

    def __init__(self) -> None:
        # Per conversation: the kept versions' JSON, newest first (the head is the current state).
        self._history: dict[ConversationKey, deque[tuple[int, str]]] = {}
        self._budgets: dict[ConversationKey, int] = {}
        # Per conversation: chunk id -> chunk JSON, and the index bytes.
        self._chunks: dict[ConversationKey, dict[str, str]] = {}
        self._indexes: dict[ConversationKey, bytes] = {}
        self._lock = threading.Lock()

    load = newest_state

    # Decoded from the state: in process it costs no round trip.
    cursor = loaded_cursor

    def save(
        self,
        key: ConversationKey,
        state: CompressionState,
        expected_version: int,
        archive: ArchiveWrite | None = None,
    ) -> bool:
        """Store ``state`` as version ``expected_version + 1`` iff the current version is
        ``expected_version``; ``archive`` is written under the same lock."""
        data = encode_state(state, expected_version + 1)
        with self._lock:
            kept = self._history.get(key)
            current = kept[0][0] if kept else 0
            if current != expected_version:
                return False
            if kept is None:
                kept = self._history[key] = deque(maxlen=HISTORY_LIMIT)
            kept.appendleft((expected_version + 1, data))
            if archive is not None:
                chunks = self._chunks.setdefault(key, {})
                for chunk in archive.chunks:
                    chunks.setdefault(chunk.chunk_id, encode_chunk(chunk))
                self._indexes[key] = archive.index
            return True

    def load_archive(self, key: ConversationKey) -> bytes | None:
        """The stored recall index, or None."""
        with self._lock:
            return self._indexes.get(key)

    def archive_chunks(self, key: ConversationKey) -> list[ArchiveChunk]:
        """Every archived chunk, in log order."""
        with self._lock:
            stored = dict(self._chunks.get(key, {}))
        return [decode_chunk(stored[i]) for i in sorted(stored)]

    def history(self, key: ConversationKey, limit: int = HISTORY_LIMIT) -> list[CompressionState]:
        """The kept versions, newest first."""
        with self._lock:
            kept = list(self._history.get(key, ()))[: max(limit, 0)]
        return [CompressionState.model_validate_json(data) for _, data in kept]

    rollback = rollback_by_save

    def delete(self, key: ConversationKey) -> None:
        """Forget the state, its history, its budget and its archive."""
        with self._lock:
            self._history.pop(key, None)
            self._budgets.pop(key, None)
            self._chunks.pop(key, None)
            self._indexes.pop(key, None)

    def get_budget(self, key: ConversationKey) -> int | None:
        """The budget last recorded for ``key``."""
        with self._lock:
            return self._budgets.get(key)

    def set_budget(self, key: ConversationKey, budget_tokens: int) -> None:
        """Record a budget (no version bump)."""
        with self._lock:
            self._budgets[key] = check_budget(budget_tokens)

    def window_reader(self, log: MessageLog) -> WindowReader | None:
        """None: in-process reads cost no round trips to save."""
        return None


@dataclass
class _Log:
    """One conversation's log: encoded messages in append order, with their counter values.

    ``seqs`` is ascending; it has gaps only where ``truncate_after`` removed messages, and
    ``counter`` (the highest id ever assigned) never goes back, so ids are never reused.
    """

    seqs: list[int] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    by_message_id: dict[str, str] = field(default_factory=dict)
    counter: int = 0
    # Stored counts (``ctxcore.state.tail``): per entry its count and running total under
    # ``run_encoding`` (None outside the counted run, which starts at ``run_from``), the
    # run's real-user seqs, and counts under other encodings by seq.
    counts: list[int | None] = field(default_factory=list)
    totals: list[int | None] = field(default_factory=list)
    run_encoding: str | None = None
    run_from: int | None = None
    real: list[int] = field(default_factory=list)
    other: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, data: str, counted: tuple[str, int, bool] | None) -> int:
        """Store one new entry; ``counted`` = (encoding, count, real) or None (ends the run)."""
        self.counter += 1
        seq = self.counter
        count = total = None
        if counted is None:
            self.run_encoding = self.run_from = None
            self.real = []
        else:
            encoding, count, real = counted
            if self.run_encoding != encoding:
                self.run_encoding, self.run_from, self.real = encoding, seq, []
            previous = self.totals[-1] if self.seqs and self.seqs[-1] >= (self.run_from or seq) else 0
            total = (previous or 0) + count
            if real:
                self.real.append(seq)
        self.seqs.append(seq)
        self.entries.append(data)
        self.counts.append(count)
        self.totals.append(total)
        return seq

    @property
    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0


class MemoryMessageLog:
    """Append-only logs in a dict; ids are a per-conversation counter, appends are atomic."""

    def __init__(self) -> None:
        self._logs: dict[ConversationKey, _Log] = {}
        self._lock = threading.Lock()

    def counted(self) -> CountedLog:
        """Itself: it stores counts and reads tails newest first."""
        return self

    def append(
        self, key: ConversationKey, messages: Sequence[AnyMessage], *, expected_last_id: str | None = None
    ) -> list[str]:
        """Append ``messages``; a known ``message_id`` gets its existing log id back.

        ``expected_last_id`` is checked under the same lock as the write (``ConflictError``).
        """
        return self._append(key, messages, expected_last_id, None)

    def append_counted(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        counts: AppendCounts,
        *,
        expected_last_id: str | None = None,
    ) -> list[str]:
        """``append`` storing each new entry's count and the running total (``CountedLog``)."""
        return self._append(key, messages, expected_last_id, check_counts(messages, counts))

    def _append(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        expected_last_id: str | None,
        counts: AppendCounts | None,
    ) -> list[str]:
        check_loggable(messages)
        if not messages:
            return []
        encoded = [encode_log_message(m) for m in messages]
        expected = expected_seq(expected_last_id)
        ids: list[str] = []
        with self._lock:
            log = self._logs.get(key) or _Log()
            if expected is not None and expected != log.last:
                logged = [log.by_message_id.get(m.message_id) if m.message_id else None for m in messages]
                start = bisect.bisect_right(log.seqs, expected)
                following = log.seqs[start : start + len(messages)]
                replay = replayed_ids([parse_log_id(i) if i else None for i in logged], expected, following)
                if replay is not None:
                    return replay
                raise append_conflict(key, expected_last_id, log.last)
            for i, (message, data) in enumerate(zip(messages, encoded, strict=True)):
                known = log.by_message_id.get(message.message_id) if message.message_id else None
                if known is not None:
                    ids.append(known)
                    continue
                counted = (counts.encoding, int(counts.counts[i]), counts.real[i]) if counts else None
                log_id = format_log_id(log.add(data, counted))
                if message.message_id:
                    log.by_message_id[message.message_id] = log_id
                ids.append(log_id)
            if log.counter:
                self._logs[key] = log
        return ids

    def _page(
        self, key: ConversationKey, first: int, last: int | None, limit: int | None
    ) -> list[AnyMessage]:
        """Messages with ``first <= counter value (<= last)``, at most ``limit`` of them."""
        with self._lock:
            log = self._logs.get(key)
            if log is None:
                return []
            start = bisect.bisect_left(log.seqs, first)
            stop = len(log.seqs) if last is None else bisect.bisect_right(log.seqs, last)
            if limit is not None:
                stop = min(stop, start + max(limit, 0))
            rows = list(zip(log.seqs[start:stop], log.entries[start:stop], strict=True))
        return decode_log_messages([(format_log_id(seq), data) for seq, data in rows])

    def read_after(
        self, key: ConversationKey, cursor: str | None, limit: int | None = None
    ) -> list[AnyMessage]:
        """Messages after ``cursor`` (from the start when None), oldest first."""
        return self._page(key, parse_log_id(cursor) + 1 if cursor is not None else 1, None, limit)

    def read_newest(self, key: ConversationKey, cursor: str | None, limit: int) -> list[AnyMessage]:
        """The newest ``limit`` messages after ``cursor``, oldest first."""
        start = parse_log_id(cursor) if cursor is not None else 0
        with self._lock:
            log = self._logs.get(key)
            if log is None or limit < 1:
                return []
            first = max(bisect.bisect_right(log.seqs, start), len(log.seqs) - limit)
            rows = list(zip(log.seqs[first:], log.entries[first:], strict=True))
        return decode_log_messages([(format_log_id(seq), data) for seq, data in rows])

    def read_range(self, key: ConversationKey, first: str, last: str) -> list[AnyMessage]:
        """Messages with ``first <= log id <= last``."""
        start, stop = parse_log_id(first), parse_log_id(last)
        if stop < start:
            return []
        return self._page(key, start, stop, None)

    get = message_by_id

    def last_id(self, key: ConversationKey) -> str | None:
        """The newest log id, or None."""
        with self._lock:
            log = self._logs.get(key)
            return format_log_id(log.last) if log and log.last else None

    def delete(self, key: ConversationKey) -> None:
        """Forget the conversation's log (its ids start again from 1)."""
        with self._lock:
            self._logs.pop(key, None)

    def truncate_after(
        self, key: ConversationKey, log_id: str, *, expected_last_id: str | None = None
    ) -> list[str]:
        """Remove the messages above ``log_id`` (see ``MessageLog.truncate_after``)."""
        after = parse_log_id(log_id)
        with self._lock:
            log = self._logs.get(key) or _Log()
            if expected_last_id is not None and expected_seq(expected_last_id) != log.last:
                raise truncate_moved(key, expected_last_id, log.last)
            cut = bisect.bisect_right(log.seqs, after)
            removed = [format_log_id(seq) for seq in log.seqs[cut:]]
            if removed:
                gone = set(removed)
                log.by_message_id = {m: i for m, i in log.by_message_id.items() if i not in gone}
                del log.seqs[cut:], log.entries[cut:], log.counts[cut:], log.totals[cut:]
                log.real = [seq for seq in log.real if seq <= after]
        return removed

    def read_tail(
        self, key: ConversationKey, cursor: str | None, *, budget_tokens: int, encoding: str
    ) -> TailRead:
        """The newest entries after ``cursor`` that fill ``budget_tokens`` (``CountedLog``)."""
        after = parse_log_id(cursor) if cursor is not None else 0
        with self._lock:
            log = self._logs.get(key) or _Log()
            plan = plan_tail(log.seqs, log.counts, log.totals, log.run_from, log.real, after, budget_tokens)
            seqs = log.seqs[plan.start :]
            rows = list(zip(seqs, log.entries[plan.start :], strict=True))
            other = log.other.get(encoding, {})
            # An entry before the run may hold the count of an earlier run's encoding.
            start = log.run_from or 0
            counts = (
                [c if seq >= start else None for seq, c in zip(seqs, log.counts[plan.start :], strict=True)]
                if log.run_encoding == encoding
                else [other.get(seq) for seq in seqs]
            )
            omitted = log.seqs[plan.cursor_index : plan.start]
            extra = [(seq, log.entries[bisect.bisect_left(log.seqs, seq)]) for seq in plan.anchors]
        return TailRead(
            messages=decode_log_messages([(format_log_id(seq), data) for seq, data in rows]),
            counts=list(counts),
            omitted=(format_log_id(omitted[0]), format_log_id(omitted[-1])) if omitted else None,
            omitted_tokens=plan.omitted_tokens,
            anchors=decode_log_messages([(format_log_id(seq), data) for seq, data in extra]),
        )

    def store_counts(self, key: ConversationKey, encoding: str, counts: Mapping[str, int]) -> None:
        """Keep counts under ``encoding`` by log id (``CountedLog``)."""
        with self._lock:
            log = self._logs.get(key)
            if log is not None:
                log.other.setdefault(encoding, {}).update({parse_log_id(i): c for i, c in counts.items()})

    def overview(self, key: ConversationKey) -> LogOverview:
        """The stored run's total when it covers the whole log (``MessageLog.overview``)."""
        with self._lock:
            log = self._logs.get(key) or _Log()
            if not log.seqs:
                return LogOverview(0, log.run_encoding, None)
            whole = log.run_from is not None and log.run_from <= log.seqs[0]
            return LogOverview(log.totals[-1] if whole else None, log.run_encoding, None)

    def list_conversations(self, tenant_id: str, after: str | None = None, limit: int = 100) -> list[str]:
        """A page of the tenant's conversation ids, in id order."""
        if not listing_wanted(tenant_id, after, limit):
            return []
        with self._lock:
            ids = [k.conversation_id for k in self._logs if k.tenant_id == tenant_id]
        return sorted(c for c in ids if after is None or c > after)[:limit]
