"""``SqlWindowReader``: one window's reads in one SQL statement.

A ``UNION ALL`` over the conversation's rows, one kind of row each: the state (head row
joined with its kept version, the cursor beside it), the budget row, the counter row (the
log's end and the counted run), the pinned entries, the newest page of the tail after the
cursor (``ORDER BY seq DESC LIMIT``) and, when the caller wants it, the recall index if it
is newer than the caller's. It runs outside a transaction (one statement is one snapshot),
so the read is one round trip; the budget is upserted after it only when it changed or the
retention's activity stamp is due (``ACTIVITY_RESOLUTION_SECONDS``).

The page stands for the tail when it holds all of it under the run's encoding (the usual
case: workers keep up). Otherwise, as on Redis, the tail is read again newest first until
the stored counts fill the budget (``SqlCountedLog.read_tail``): a tail longer than a page,
counts under another encoding, or a state saved before its head row held the cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    Integer,
    LargeBinary,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    func,
    literal,
    null,
    select,
    union_all,
)

from ctxcore.messages import AnyMessage
from ctxcore.state.base import MessageLog, check_pinned, format_log_id, read_pinned
from ctxcore.state.budget import BudgetTokens
from ctxcore.state.decoded import DecodedEntries, Row, decoded_rows
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.retention import ACTIVITY_RESOLUTION_SECONDS
from ctxcore.state.sql.engine import SqlBackend, translated_errors
from ctxcore.state.tail import TAIL_PAGE, CountedLog, TailRead
from ctxcore.state.window_read import WindowRead

__all__ = ["SqlWindowReader", "write_budget"]

# The kinds of rows the statement returns (its first column).
_STATE, _BUDGET, _COUNTER, _PINNED, _PAGE, _INDEX = range(6)


class SqlWindowReader:
    """Reads windows for a ``SqlStateStore`` and ``SqlMessageLog`` of one database and prefix
    (``SqlStateStore.window_reader``): ``state`` is the store (its tables, and the budget row
    the reader writes), ``log`` and ``tails`` the log."""

    def __init__(
        self,
        state: SqlBackend,
        log: MessageLog,
        tails: CountedLog,
        decoded: DecodedEntries | None = None,
    ) -> None:
        self._state = state
        self._tables = state._t
        self._log = log
        self._tails = tails
        self._engine = state.engine
        self._clock = state._clock
        # Consecutive windows read the same page: its entries are decoded once per process.
        self.decoded = decoded if decoded is not None else DecodedEntries()
        self._statements = {False: self._statement(False), True: self._statement(True)}
        # How many reads needed the tail read again after the statement (tests read it).
        self.tail_reads = 0

    def refresh(self, key: ConversationKey) -> None:
        """Nothing to do: SQL stamps activity in the budget row (see ``read``)."""

    def _statement(self, with_index: bool) -> Select[Any]:
        t = self._tables
        tenant: Any = bindparam("tenant")
        conversation: Any = bindparam("conversation")

        def mine(table: Any) -> Any:
            return and_(table.c.tenant_id == tenant, table.c.conversation_id == conversation)

        def row(
            kind: int,
            seq: Any = None,
            data: Any = None,
            n: Any = None,
            f: Any = None,
            s: Any = None,
            blob: Any = None,
        ) -> tuple[Any, ...]:
            # Typed NULLs: PostgreSQL resolves each column's type from every member of the union.
            return (
                literal(kind, Integer).label("kind"),
                (seq if seq is not None else cast(null(), BigInteger)).label("seq"),
                (data if data is not None else cast(null(), Text)).label("data"),
                (n if n is not None else cast(null(), BigInteger)).label("n"),
                (f if f is not None else cast(null(), Float)).label("f"),
                (s if s is not None else cast(null(), Text)).label("s"),
                (blob if blob is not None else cast(null(), LargeBinary)).label("blob"),
            )

        head, kept, log, pinned = t.state, t.state_history, t.log, t.state_pinned
        joined = head.join(
            kept,
            and_(
                kept.c.tenant_id == head.c.tenant_id,
                kept.c.conversation_id == head.c.conversation_id,
                kept.c.version == head.c.version,
            ),
        )
        cursor = func.coalesce(select(head.c.covered_seq).where(mine(head)).scalar_subquery(), 0)
        page = (
            select(*row(_PAGE, log.c.seq, log.c.data, log.c.tokens))
            .where(mine(log), log.c.seq > cursor)
            .order_by(log.c.seq.desc())
            .limit(TAIL_PAGE)
            .subquery()
        )
        members: list[Select[Any]] = [
            select(*row(_STATE, head.c.version, kept.c.data, head.c.covered_seq))
            .select_from(joined)
            .where(mine(head)),
            select(*row(_BUDGET, n=t.budget.c.budget_tokens, f=t.budget.c.last_active_at)).where(
                mine(t.budget)
            ),
            select(
                *row(
                    _COUNTER,
                    t.log_counter.c.last_seq,
                    n=t.log_counter.c.run_from,
                    s=t.log_counter.c.run_encoding,
                )
            ).where(mine(t.log_counter)),
            # Driven by the few pinned rows, each a primary-key lookup in the log (a join or
            # an IN let SQLite and PostgreSQL scan the conversation's whole log instead).
            select(
                *row(
                    _PINNED,
                    pinned.c.seq,
                    select(log.c.data).where(mine(log), log.c.seq == pinned.c.seq).scalar_subquery(),
                )
            ).where(mine(pinned)),
            select(*(page.c[name] for name in ("kind", "seq", "data", "n", "f", "s", "blob"))),
        ]
        if with_index:
            index = t.archive_index
            members.append(
                select(*row(_INDEX, index.c.version, blob=index.c.data)).where(
                    mine(index), index.c.version > bindparam("held")
                )
            )
        return union_all(*members)  # type: ignore[return-value]

    @contextmanager
    def _one_statement(self, what: str) -> Iterator[Connection]:
        # Autocommit: one statement needs no transaction, and BEGIN/COMMIT would be two more
        # round trips on PostgreSQL.
        with translated_errors(what), self._engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def read(
        self,
        key: ConversationKey,
        budget_tokens: BudgetTokens,
        encoding: str,
        index_version: int | None = None,
    ) -> WindowRead:
        """The window's reads; the budget recorded when it differs from the stored one (or
        the activity stamp is due). ``index_version``: the recall index version the caller
        holds (None: recall off)."""
        params: dict[str, Any] = {"tenant": key.tenant_id, "conversation": key.conversation_id}
        if index_version is not None:
            params["held"] = index_version
        with self._one_statement(f"window read of {key}") as conn:
            rows = conn.execute(self._statements[index_version is not None], params).all()
        found: dict[int, list[Any]] = {}
        for r in rows:
            found.setdefault(r.kind, []).append(r)
        state_row = found.get(_STATE, [None])[0]
        counter = found.get(_COUNTER, [None])[0]
        last_seq = int(counter.seq) if counter is not None and counter.seq is not None else 0
        if state_row is None and last_seq == 0:
            return WindowRead(None, [], TailRead([], []))  # no such conversation: nothing written
        budget = found.get(_BUDGET, [None])[0]
        if budget is None or budget.n != budget_tokens or _stamp_due(budget.f, self._clock()):
            write_budget(self._state, key, budget_tokens)
        state = CompressionState.model_validate_json(state_row.data) if state_row is not None else None
        if state is not None and state_row.n is None:
            # Saved before the head row held the cursor: read the way it was written.
            pinned = read_pinned(self._log, key, state)
            tail = self._tails.read_tail(
                key, state.covered_until, budget_tokens=budget_tokens, encoding=encoding
            )
            self.tail_reads += 1
        else:
            pinned = self._decoded(
                sorted((r for r in found.get(_PINNED, []) if r.data is not None), key=lambda r: r.seq)
            )
            check_pinned(key, state, pinned)
            cursor = int(state_row.n) if state_row is not None else 0
            page = _page(found.get(_PAGE, []), cursor, counter, encoding)
            if page is None:
                tail = self._tails.read_tail(
                    key,
                    format_log_id(cursor) if cursor else None,
                    budget_tokens=budget_tokens,
                    encoding=encoding,
                )
                self.tail_reads += 1
            else:
                tail = TailRead(self.decoded.decode(page[0], decoded_rows), page[1])
        index = found.get(_INDEX, [None])[0]
        return WindowRead(
            state=state,
            pinned=pinned,
            tail=tail,
            last_id=format_log_id(last_seq) if last_seq > 0 else None,
            index=bytes(index.blob) if index is not None else None,
        )

    def _decoded(self, rows: list[Any]) -> list[AnyMessage]:
        return self.decoded.decode([(int(r.seq), r.data.encode()) for r in rows], decoded_rows)


def write_budget(state: SqlBackend, key: ConversationKey, budget_tokens: BudgetTokens) -> None:
    """Record ``budget_tokens`` for ``key`` (an upsert beside the state, no version bump) and
    the window's activity (``last_active_at``, for the retention sweep): the reader's write
    when the budget changed, and ``SqlStateStore.set_budget``."""
    budget, now = state._t.budget, state._clock()
    with state._write(f"set_budget {key}") as conn:
        conn.execute(
            state._insert(conn, budget)
            .values(
                tenant_id=key.tenant_id,
                conversation_id=key.conversation_id,
                budget_tokens=budget_tokens,
                last_active_at=now,
            )
            .on_conflict_do_update(
                index_elements=[budget.c.tenant_id, budget.c.conversation_id],
                # Each window records its budget here: the retention sweep's clock too,
                # in the statement a window runs anyway.
                set_={
                    "budget_tokens": budget_tokens,
                    "last_active_at": state._stamp(budget.c.last_active_at, now),
                },
            )
        )


def _stamp_due(stamp: float | None, now: float) -> bool:
    return stamp is None or stamp < now - ACTIVITY_RESOLUTION_SECONDS


def _page(
    rows: list[Any], cursor: int, counter: Any, encoding: str
) -> tuple[list[Row], list[int | None]] | None:
    """The tail's rows and counts from the page (newest first), or None when it cannot stand
    for the tail (see the module docstring)."""
    if counter is None or counter.s != encoding or counter.n is None:
        return None if rows else ([], [])  # counts under another encoding (or none at all)
    ordered = sorted(rows, key=lambda r: r.seq)
    if len(ordered) >= TAIL_PAGE and ordered[0].seq != cursor + 1:
        return None  # the tail may go on past the page
    start = int(counter.n)
    # Counts of the run only (a row before it may hold an earlier run's count).
    return (
        [(int(r.seq), r.data.encode()) for r in ordered],
        [int(r.n) if r.n is not None and r.seq >= start else None for r in ordered],
    )
