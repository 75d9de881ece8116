"""``SqlStateStore``: compaction states (head row and kept versions), budgets and the recall
archive in SQL (the schema is ``ctxcore.state.sql.schema``'s)."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ctxcore.errors import StoreError
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite, decode_chunk, encode_chunk
from ctxcore.state.base import (
    HISTORY_LIMIT,
    MessageLog,
    encode_state,
    format_log_id,
    loaded_cursor,
    newest_state,
    rollback_by_save,
)
from ctxcore.state.budget import check_budget
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.sql.engine import SqlBackend
from ctxcore.state.sql.log import SqlMessageLog
from ctxcore.state.sql.schema import window_head
from ctxcore.state.sql.window import SqlWindowReader, write_budget
from ctxcore.state.window_read import WindowReader

__all__ = ["SqlStateStore"]


class SqlStateStore(SqlBackend):
    """Compaction states in SQL: a head row per conversation plus the kept versions.

    ``SqlStateStore("sqlite:///ctx.db")`` or ``SqlStateStore(engine=engine)``; call ``setup()`` once.
    """

    load = newest_state

    def cursor(self, key: ConversationKey) -> str | None:
        """The cursor from the head row (``covered_seq``, 0: none), without the state's JSON; a
        state whose head row holds no cursor (saved before it did, or with ids that are not
        log ids) is loaded instead."""
        head = self._t.state
        with self._read(f"cursor {key}") as conn:
            row = conn.execute(select(head.c.covered_seq).where(self._where(head, key))).first()
        if row is None:
            return None
        if row.covered_seq is None:
            return loaded_cursor(self, key)
        return format_log_id(int(row.covered_seq)) if row.covered_seq else None

    def save(
        self,
        key: ConversationKey,
        state: CompressionState,
        expected_version: int,
        archive: ArchiveWrite | None = None,
    ) -> bool:
        """Store ``state`` as version ``expected_version + 1`` iff the current version is
        ``expected_version``; ``archive`` is written in the same transaction."""
        new_version = expected_version + 1
        data = encode_state(state, new_version)
        head, kept, pinned = self._t.state, self._t.state_history, self._t.state_pinned
        ids = {"tenant_id": key.tenant_id, "conversation_id": key.conversation_id}
        cursor, pinned_seqs = window_head(state)
        try:
            with self._write(f"save {key}") as conn:
                if expected_version == 0:
                    conn.execute(insert(head).values(**ids, version=new_version, covered_seq=cursor))
                else:
                    moved = conn.execute(
                        update(head)
                        .where(self._where(head, key), head.c.version == expected_version)
                        .values(version=new_version, covered_seq=cursor)
                    )
                    if moved.rowcount != 1:
                        return False
                # What a window reads in its one statement (``ctxcore.state.sql.window``).
                conn.execute(delete(pinned).where(self._where(pinned, key)))
                if pinned_seqs:
                    conn.execute(insert(pinned).values([{**ids, "seq": seq} for seq in pinned_seqs]))
                conn.execute(insert(kept).values(**ids, version=new_version, data=data))
                conn.execute(
                    delete(kept).where(self._where(kept, key), kept.c.version <= new_version - HISTORY_LIMIT)
                )
                if archive is not None:
                    self._write_archive(conn, key, archive)
        except StoreError as exc:
            # First-insert race: the other writer's head row holds the primary key.
            if isinstance(exc.__cause__, IntegrityError):
                return False
            raise
        return True

    def _write_archive(self, conn: Connection, key: ConversationKey, archive: ArchiveWrite) -> None:
        ids = {"tenant_id": key.tenant_id, "conversation_id": key.conversation_id}
        chunks, index = self._t.archive_chunk, self._t.archive_index
        if archive.chunks:
            conn.execute(
                self._insert(conn, chunks)
                .values([{**ids, "chunk_id": c.chunk_id, "data": encode_chunk(c)} for c in archive.chunks])
                .on_conflict_do_nothing(
                    index_elements=[chunks.c.tenant_id, chunks.c.conversation_id, chunks.c.chunk_id]
                )
            )
        conn.execute(
            self._insert(conn, index)
            .values(**ids, version=archive.version, data=archive.index)
            .on_conflict_do_update(
                index_elements=[index.c.tenant_id, index.c.conversation_id],
                set_={"version": archive.version, "data": archive.index},
            )
        )

    def load_archive(self, key: ConversationKey) -> bytes | None:
        """The stored recall index, or None."""
        index = self._t.archive_index
        with self._read(f"load archive of {key}") as conn:
            data = conn.execute(select(index.c.data).where(self._where(index, key))).scalar_one_or_none()
        return bytes(data) if data is not None else None

    def archive_chunks(self, key: ConversationKey) -> list[ArchiveChunk]:
        """Every archived chunk, in log order."""
        chunks = self._t.archive_chunk
        query = select(chunks.c.data).where(self._where(chunks, key)).order_by(chunks.c.chunk_id)
        with self._read(f"read archive of {key}") as conn:
            rows = conn.execute(query).scalars().all()
        return [decode_chunk(data) for data in rows]

    def history(self, key: ConversationKey, limit: int = HISTORY_LIMIT) -> list[CompressionState]:
        """The kept versions, newest first."""
        if limit < 1:
            return []
        kept = self._t.state_history
        query = select(kept.c.data).where(self._where(kept, key)).order_by(kept.c.version.desc()).limit(limit)
        with self._read(f"history {key}") as conn:
            rows = conn.execute(query).scalars().all()
        return [CompressionState.model_validate_json(data) for data in rows]

    rollback = rollback_by_save

    def delete(self, key: ConversationKey) -> None:
        """Remove the state, its history, its budget and its archive in one transaction."""
        self._delete_all(
            f"delete {key}",
            key,
            self._t.state,
            self._t.state_pinned,
            self._t.state_history,
            self._t.budget,
            self._t.archive_chunk,
            self._t.archive_index,
        )

    def get_budget(self, key: ConversationKey) -> int | None:
        """The budget last recorded for ``key``."""
        budget = self._t.budget
        with self._read(f"get_budget {key}") as conn:
            value = conn.execute(select(budget.c.budget_tokens).where(self._where(budget, key))).scalar()
        return int(value) if value is not None else None

    def set_budget(self, key: ConversationKey, budget_tokens: int) -> None:
        """Record a budget (an upsert beside the state, no version bump) and the window's
        activity (``last_active_at``, for the retention sweep)."""
        write_budget(self, key, check_budget(budget_tokens))

    def window_reader(self, log: MessageLog) -> WindowReader | None:
        """A ``SqlWindowReader`` when ``log`` is the ``SqlMessageLog`` of this database and prefix."""
        if not (
            isinstance(log, SqlMessageLog)
            and log.engine.url == self.engine.url
            and log.table_prefix == self.table_prefix
        ):
            return None
        return SqlWindowReader(self, log, log.counted())
