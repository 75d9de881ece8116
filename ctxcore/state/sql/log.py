"""The SQL message log (SQLAlchemy 2 Core), on the schema and helpers of ``ctxcore.state.sql``.

Rows are keyed by (tenant, conversation, seq); ids come from the conversation's counter
row, which every append locks (``SELECT ... FOR UPDATE``; on SQLite the write transaction
itself is the lock), so ids are gap-free until a ``truncate_after`` (which never lowers the counter), the counter advances in the same transaction as
the rows, and ``expected_last_id`` is checked against the locked counter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, delete, func, insert, select, update

from ctxcore.messages import AnyMessage
from ctxcore.state.base import (
    LogOverview,
    append_conflict,
    check_loggable,
    decode_log_messages,
    encode_log_message,
    expected_seq,
    format_log_id,
    parse_log_id,
    replayed_ids,
    truncate_moved,
)
from ctxcore.state.keys import ConversationKey, listing_wanted
from ctxcore.state.sql.engine import SqlBackend
from ctxcore.state.sql.tail import SqlCountedLog
from ctxcore.state.tail import AppendCounts, CountedLog

__all__ = ["SqlMessageLog"]


class SqlMessageLog(SqlBackend):
    """Append-only logs in SQL: rows keyed by (tenant, conversation, seq), ids from a counter row.

    ``SqlMessageLog("sqlite:///ctx.db")`` or ``SqlMessageLog(engine=engine)``; call ``setup()`` once.
    """

    def counted(self) -> CountedLog:
        """Its ``CountedLog``: appends storing counts, newest-first tails (``SqlCountedLog``)."""
        return SqlCountedLog(self._t, self._read, self._write, self._where, self._insert, self._append_with)

    def append(
        self, key: ConversationKey, messages: Sequence[AnyMessage], *, expected_last_id: str | None = None
    ) -> list[str]:
        """Append ``messages`` in one transaction; a known ``message_id`` gets its existing log id back.

        ``expected_last_id`` is checked against the locked counter row (``ConflictError``).
        """
        return self._append_with(key, messages, expected_last_id, None)

    def _append_with(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        expected_last_id: str | None,
        counts: AppendCounts | None,
    ) -> list[str]:
        check_loggable(messages)
        if not messages:
            return []
        expected = expected_seq(expected_last_id)
        # A message_id is stored as a fixed-size digest: it keeps the unique index small
        # whatever the client's ids look like.
        encoded = [
            (
                hashlib.sha256(m.message_id.encode()).hexdigest() if m.message_id else None,
                encode_log_message(m),
            )
            for m in messages
        ]
        counter, log = self._t.log_counter, self._t.log
        ids = {"tenant_id": key.tenant_id, "conversation_id": key.conversation_id}
        now = self._clock()
        with self._write(f"append to {key}") as conn:
            # Create the counter row if needed and lock it: appends to one conversation queue here.
            conn.execute(
                self._insert(conn, counter)
                .values(**ids, last_seq=0, last_active_at=now)
                .on_conflict_do_nothing(index_elements=[counter.c.tenant_id, counter.c.conversation_id])
            )
            last, run_encoding, run_from, run_total = conn.execute(
                select(counter.c.last_seq, counter.c.run_encoding, counter.c.run_from, counter.c.run_total)
                .where(self._where(counter, key))
                .with_for_update()
            ).one()
            wanted = {k for k, _ in encoded if k is not None}
            known: dict[str, int] = {}
            if wanted:
                found = conn.execute(
                    select(log.c.message_key, log.c.seq).where(
                        self._where(log, key), log.c.message_key.in_(sorted(wanted))
                    )
                )
                known = {row.message_key: row.seq for row in found}
            current = self._last_seq(conn, key) if expected is not None else last
            if expected is not None and expected != current:
                # Raising rolls back the transaction, the counter row it may have created too.
                following = conn.execute(
                    select(log.c.seq)
                    .where(self._where(log, key), log.c.seq > expected)
                    .order_by(log.c.seq)
                    .limit(len(encoded))
                ).scalars()
                replay = replayed_ids(
                    [known.get(k) if k else None for k, _ in encoded], expected, list(following)
                )
                if replay is not None:
                    return replay
                raise append_conflict(key, expected_last_id, current)
            log_ids: list[str] = []
            rows: list[dict[str, Any]] = []
            for i, (message_key, data) in enumerate(encoded):
                seq = known.get(message_key) if message_key is not None else None
                if seq is None:
                    last += 1
                    seq = last
                    row = {**ids, "seq": seq, "message_key": message_key, "data": data}
                    if counts is None:  # a plain append ends the counted run
                        run_encoding = run_from = run_total = None
                        row.update(tokens=None, total=None, is_real=None)
                    else:
                        if run_encoding != counts.encoding:
                            run_encoding, run_from, run_total = counts.encoding, seq, 0
                        run_total = (run_total or 0) + int(counts.counts[i])
                        row.update(tokens=int(counts.counts[i]), total=run_total, is_real=int(counts.real[i]))
                    rows.append(row)
                    if message_key is not None:
                        known[message_key] = seq  # a duplicate later in the same batch
                log_ids.append(format_log_id(seq))
            if rows:
                conn.execute(insert(log), rows)
                conn.execute(
                    update(counter)
                    .where(self._where(counter, key))
                    .values(
                        last_seq=last,
                        run_encoding=run_encoding,
                        run_from=run_from,
                        run_total=run_total,
                        # The retention sweep's clock: an append is activity.
                        last_active_at=self._stamp(counter.c.last_active_at, now),
                    )
                )
        return log_ids

    def _select(
        self, key: ConversationKey, *conditions: ColumnElement[bool], limit: int | None
    ) -> list[AnyMessage]:
        log = self._t.log
        query = select(log.c.seq, log.c.data).where(self._where(log, key), *conditions).order_by(log.c.seq)
        if limit is not None:
            query = query.limit(limit)
        with self._read(f"read {key}") as conn:
            rows = conn.execute(query).all()
        return decode_log_messages([(format_log_id(row.seq), row.data) for row in rows])

    def read_after(
        self, key: ConversationKey, cursor: str | None, limit: int | None = None
    ) -> list[AnyMessage]:
        """Messages after ``cursor`` (from the start when None), oldest first."""
        after = parse_log_id(cursor) if cursor is not None else 0
        if limit is not None and limit < 1:
            return []
        return self._select(key, self._t.log.c.seq > after, limit=limit)

    def read_newest(self, key: ConversationKey, cursor: str | None, limit: int) -> list[AnyMessage]:
        """The newest ``limit`` messages after ``cursor``, oldest first (one statement)."""
        if limit < 1:
            return []
        log = self._t.log
        query = (
            select(log.c.seq, log.c.data)
            .where(self._where(log, key), log.c.seq > (parse_log_id(cursor) if cursor is not None else 0))
            .order_by(log.c.seq.desc())
            .limit(limit)
        )
        with self._read(f"read {key}") as conn:
            rows = conn.execute(query).all()
        return decode_log_messages([(format_log_id(row.seq), row.data) for row in reversed(rows)])

    def read_range(self, key: ConversationKey, first: str, last: str) -> list[AnyMessage]:
        """Messages with ``first <= log id <= last``."""
        seq = self._t.log.c.seq
        return self._select(key, seq >= parse_log_id(first), seq <= parse_log_id(last), limit=None)

    def get(self, key: ConversationKey, log_id: str) -> AnyMessage | None:
        """One message, or None."""
        return next(iter(self._select(key, self._t.log.c.seq == parse_log_id(log_id), limit=1)), None)

    def _last_seq(self, conn: Connection, key: ConversationKey) -> int:
        # The newest remaining row, not the counter: after a truncation the counter stays
        # above it (ids are never reused). One primary-key index lookup.
        log = self._t.log
        last = conn.execute(select(func.max(log.c.seq)).where(self._where(log, key))).scalar()
        return int(last or 0)

    def last_id(self, key: ConversationKey) -> str | None:
        """The newest log id, or None."""
        with self._read(f"last_id {key}") as conn:
            last = self._last_seq(conn, key)
        return format_log_id(last) if last else None

    def truncate_after(
        self, key: ConversationKey, log_id: str, *, expected_last_id: str | None = None
    ) -> list[str]:
        """Remove the messages above ``log_id`` in one transaction holding the counter row's
        lock, as appends do (see ``MessageLog.truncate_after``); the counter is left as it is."""
        after = parse_log_id(log_id)
        counter, log = self._t.log_counter, self._t.log
        with self._write(f"truncate {key}") as conn:
            run_from = conn.execute(
                select(counter.c.run_from).where(self._where(counter, key)).with_for_update()
            ).scalar()
            current = self._last_seq(conn, key)
            if expected_last_id is not None and expected_seq(expected_last_id) != current:
                raise truncate_moved(key, expected_last_id, current)
            removed = conn.execute(
                select(log.c.seq).where(self._where(log, key), log.c.seq > after).order_by(log.c.seq)
            ).scalars()
            ids = [format_log_id(seq) for seq in removed]
            if ids:
                conn.execute(delete(log).where(self._where(log, key), log.c.seq > after))
                if run_from is not None:
                    # The run's total goes back to that of the last entry kept (0: none kept).
                    kept = conn.execute(
                        select(log.c.total)
                        .where(self._where(log, key), log.c.seq >= run_from)
                        .order_by(log.c.seq.desc())
                        .limit(1)
                    ).scalar()
                    conn.execute(update(counter).where(self._where(counter, key)).values(run_total=kept or 0))
        return ids

    def overview(self, key: ConversationKey) -> LogOverview:
        """The counter row's run total (when the run starts at the first entry) and its
        retention stamp: one row read, no entry read."""
        counter = self._t.log_counter
        cols = (counter.c.run_encoding, counter.c.run_from, counter.c.run_total, counter.c.last_active_at)
        with self._read(f"overview of {key}") as conn:
            row = conn.execute(select(*cols).where(self._where(counter, key))).first()
        if row is None:
            return LogOverview(0, None, None)
        # Ids start at 1 and only the newest are ever removed: a run from 1 is the whole log.
        whole = row.run_from is not None and row.run_from <= 1 and row.run_total is not None
        return LogOverview(int(row.run_total) if whole else None, row.run_encoding, row.last_active_at)

    def delete(self, key: ConversationKey) -> None:
        """Remove the log and its counter (ids of a later append start again from 1)."""
        self._delete_all(f"delete {key}", key, self._t.log_counter, self._t.log, self._t.log_count)

    def list_conversations(self, tenant_id: str, after: str | None = None, limit: int = 100) -> list[str]:
        """A page of the tenant's conversation ids, in id order."""
        if not listing_wanted(tenant_id, after, limit):
            return []
        counter = self._t.log_counter
        query = select(counter.c.conversation_id).where(counter.c.tenant_id == tenant_id)
        if after is not None:
            query = query.where(counter.c.conversation_id > after)
        query = query.order_by(counter.c.conversation_id).limit(limit)
        with self._read(f"list conversations of {tenant_id}") as conn:
            return list(conn.execute(query).scalars().all())
