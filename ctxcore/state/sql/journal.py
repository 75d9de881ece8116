"""``SqlStageJournal``: a conversation's stage journal in SQL, one row per entry."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.engine import URL

from ctxcore.errors import StoreError
from ctxcore.state.journal import JOURNAL_LIMIT, JournalEntry
from ctxcore.state.keys import ConversationKey
from ctxcore.state.sql.engine import SqlBackend

__all__ = ["SqlStageJournal"]

# Appends of one conversation racing on PostgreSQL can pick the same seq; the loser retries.
_APPEND_ATTEMPTS = 5


class SqlStageJournal(SqlBackend):
    """Rows ``(tenant, conversation, seq, data)``; each append removes the rows more than
    ``limit`` below it in the same transaction. The table is one of the conversation's, so
    deleting the conversation or the retention sweep removes it too."""

    def __init__(
        self,
        url: str | URL | None = None,
        table_prefix: str = "ctxcore_",
        *,
        engine: Engine | None = None,
        limit: int = JOURNAL_LIMIT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, table_prefix, engine=engine, clock=clock)
        self.limit = limit

    def append(self, key: ConversationKey, entry: JournalEntry) -> None:
        """Add ``entry`` as the newest; the conversation keeps ``limit`` rows."""
        journal, data = self._t.journal, entry.to_json()
        for _ in range(_APPEND_ATTEMPTS):
            with self._write(f"journal of {key}") as conn:
                last = conn.execute(select(func.max(journal.c.seq)).where(self._where(journal, key))).scalar()
                seq = int(last or 0) + 1
                written = conn.execute(
                    self._insert(conn, journal)
                    .values(tenant_id=key.tenant_id, conversation_id=key.conversation_id, seq=seq, data=data)
                    .on_conflict_do_nothing(
                        index_elements=[journal.c.tenant_id, journal.c.conversation_id, journal.c.seq]
                    )
                    .execution_options(preserve_rowcount=True)
                )
                if written.rowcount != 1:
                    continue
                conn.execute(
                    delete(journal).where(self._where(journal, key), journal.c.seq <= seq - self.limit)
                )
                return
        raise StoreError(f"journal of {key}: {_APPEND_ATTEMPTS} concurrent appends took the same slot; retry")

    def entries(self, key: ConversationKey, limit: int = JOURNAL_LIMIT) -> list[JournalEntry]:
        """Up to ``limit`` entries, newest first."""
        if limit <= 0:
            return []
        journal = self._t.journal
        query = (
            select(journal.c.data)
            .where(self._where(journal, key))
            .order_by(journal.c.seq.desc())
            .limit(limit)
        )
        with self._read(f"read journal of {key}") as conn:
            rows = conn.execute(query).scalars().all()
        return [JournalEntry.from_json(raw) for raw in rows]

    def delete(self, key: ConversationKey) -> None:
        """Forget the conversation's journal."""
        self._delete_all(f"delete journal of {key}", key, self._t.journal)
