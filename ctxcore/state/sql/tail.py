"""Stored counts and newest-first tails in SQL (``SqlMessageLog.counted()``).

Each counted row carries ``tokens`` (its count), ``total`` (the run's running total through
it) and ``is_real``; the counter row, which every append locks, holds the run
(``run_encoding``, ``run_from``, ``run_total``); ``log_count`` keeps counts under other
encodings. A tail is read ``ORDER BY seq DESC LIMIT`` a page at a time, never past the cursor,
until the counts read fill the budget (``ctxcore.state.tail``), in one read transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import ColumnElement, Connection, Table, func, select

from ctxcore.messages import AnyMessage
from ctxcore.state.base import decode_log_messages, format_log_id, parse_log_id
from ctxcore.state.keys import ConversationKey
from ctxcore.state.sql.schema import Tables
from ctxcore.state.tail import TAIL_PAGE, AppendCounts, TailRead, check_counts

__all__ = ["SqlCountedLog"]

Transaction = Callable[[str], AbstractContextManager[Connection]]


class SqlCountedLog:
    """The ``CountedLog`` of a ``SqlMessageLog`` (its ``counted()``): the log's tables, its
    read and write transactions, key filter and dialect insert, and its counting append."""

    def __init__(
        self,
        tables: Tables,
        read: Transaction,
        write: Transaction,
        where: Callable[[Table, ConversationKey], ColumnElement[bool]],
        insert: Callable[[Connection, Table], Any],
        append: Callable[[ConversationKey, Sequence[AnyMessage], str | None, AppendCounts], list[str]],
    ) -> None:
        self._t = tables
        self._read = read
        self._write = write
        self._where = where
        self._insert = insert
        self._append = append

    def append_counted(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        counts: AppendCounts,
        *,
        expected_last_id: str | None = None,
    ) -> list[str]:
        """``append`` storing counts and the running total in the same transaction."""
        return self._append(key, messages, expected_last_id, check_counts(messages, counts))

    def read_tail(
        self, key: ConversationKey, cursor: str | None, *, budget_tokens: int, encoding: str
    ) -> TailRead:
        """The newest entries after ``cursor`` filling ``budget_tokens``."""
        after = parse_log_id(cursor) if cursor is not None else 0
        log, counter = self._t.log, self._t.log_counter
        where = self._where(log, key)
        cols = (log.c.seq, log.c.data, log.c.tokens, log.c.total)
        with self._read(f"read tail of {key}") as conn:
            run = conn.execute(
                select(counter.c.run_encoding, counter.c.run_from).where(self._where(counter, key))
            ).one_or_none()
            run_encoding, run_from = (run.run_encoding, run.run_from) if run is not None else (None, None)
            first = conn.execute(select(func.min(log.c.seq)).where(where, log.c.seq > after)).scalar()
            if first is None:
                return TailRead([], [])
            if run_from is None or first < run_from:  # entries outside the run: read whole
                rows = list(conn.execute(select(*cols).where(where, log.c.seq > after).order_by(log.c.seq)))
                return self._tail(conn, key, rows, encoding, run_encoding, run_from)
            newest: list[Any] = []
            below: int | None = None
            read = 0
            while True:
                query = select(*cols).where(where, log.c.seq > after)
                if below is not None:
                    query = query.where(log.c.seq < below)
                page = list(conn.execute(query.order_by(log.c.seq.desc()).limit(TAIL_PAGE)))
                newest.extend(page)
                read += sum(r.tokens or 0 for r in page)
                if len(page) < TAIL_PAGE:
                    below = None
                    break
                below = page[-1].seq
                if read >= budget_tokens:
                    break
            rows = newest[::-1]
            older = None
            if below is not None:
                older = conn.execute(
                    select(log.c.seq, log.c.total)
                    .where(where, log.c.seq > after, log.c.seq < below)
                    .order_by(log.c.seq.desc())
                    .limit(1)
                ).one_or_none()
            out = self._tail(conn, key, rows, encoding, run_encoding, run_from)
            if older is None:
                return out
            base = conn.execute(
                select(log.c.total)
                .where(where, log.c.seq <= after, log.c.seq >= run_from)
                .order_by(log.c.seq.desc())
                .limit(1)
            ).scalar()
            out.omitted = (format_log_id(first), format_log_id(older.seq))
            out.omitted_tokens = (older.total or 0) - (base or 0)
            out.anchors = self._anchors(conn, key, after, older.seq)
            return out

    def _anchors(self, conn: Connection, key: ConversationKey, after: int, last: int) -> list[AnyMessage]:
        log = self._t.log
        found: dict[int, Any] = {}
        for order in (log.c.seq, log.c.seq.desc()):
            row = conn.execute(
                select(log.c.seq, log.c.data)
                .where(self._where(log, key), log.c.seq > after, log.c.seq <= last, log.c.is_real == 1)
                .order_by(order)
                .limit(1)
            ).one_or_none()
            if row is not None:
                found[row.seq] = row.data
        return decode_log_messages([(format_log_id(s), found[s]) for s in sorted(found)])

    def _tail(
        self,
        conn: Connection,
        key: ConversationKey,
        rows: Sequence[Any],
        encoding: str,
        run_encoding: str | None,
        run_from: int | None,
    ) -> TailRead:
        messages = decode_log_messages([(format_log_id(r.seq), r.data) for r in rows])
        if run_encoding == encoding and run_from is not None:
            # A row before the run may hold the count of an earlier run's encoding.
            return TailRead(messages, [r.tokens if r.seq >= run_from else None for r in rows])
        table = self._t.log_count
        found = conn.execute(
            select(table.c.seq, table.c.tokens).where(
                self._where(table, key),
                table.c.encoding == encoding,
                table.c.seq.in_([r.seq for r in rows]),
            )
        )
        stored: dict[int, int] = {r.seq: r.tokens for r in found}
        return TailRead(messages, [stored.get(r.seq) for r in rows])

    def store_counts(self, key: ConversationKey, encoding: str, counts: Mapping[str, int]) -> None:
        """Keep counts under ``encoding`` (first write wins: a count does not change)."""
        if not counts:
            return
        table = self._t.log_count
        ids = {"tenant_id": key.tenant_id, "conversation_id": key.conversation_id}
        rows = [
            {**ids, "encoding": encoding, "seq": parse_log_id(i), "tokens": int(c)} for i, c in counts.items()
        ]
        with self._write(f"store counts of {key}") as conn:
            conn.execute(
                self._insert(conn, table)
                .values(rows)
                .on_conflict_do_nothing(
                    index_elements=[table.c.tenant_id, table.c.conversation_id, table.c.encoding, table.c.seq]
                )
            )
