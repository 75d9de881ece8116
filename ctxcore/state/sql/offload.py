"""``SqlOffloadStore``: offloaded originals in SQL, with their expiry."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sqlalchemy import Engine, delete, or_, select
from sqlalchemy.engine import URL

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, messages_from_json, messages_to_json
from ctxcore.state.filesystem import no_files, put_one, validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.state.sql.engine import SqlBackend

__all__ = ["SqlOffloadStore"]


class SqlOffloadStore(SqlBackend):
    """Offloaded originals in SQL, one row per (conversation, handle); first write wins.

    With ``ttl_seconds`` an offload expires that long after it was stored; expired rows are
    invisible and are purged by the conversation's next put.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        table_prefix: str = "ctxcore_",
        *,
        engine: Engine | None = None,
        ttl_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, table_prefix, engine=engine, clock=clock)
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ConfigError(f"SqlOffloadStore ttl_seconds must be positive or None, got {ttl_seconds!r}")
        self.ttl_seconds = ttl_seconds

    put_if_absent = put_one

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        """``put_if_absent`` of each (handle, messages) in order, in one statement; a handle
        repeated in ``items`` is written once (its first messages)."""
        first: dict[str, Sequence[AnyMessage]] = {}
        for handle, messages in items:
            first.setdefault(validate_handle(handle), messages)
        if not first:
            return []
        offload, now = self._t.offload, time.time()
        expires_at = now + self.ttl_seconds if self.ttl_seconds is not None else None
        rows = [
            {
                "tenant_id": key.tenant_id,
                "conversation_id": key.conversation_id,
                "handle": handle,
                "data": messages_to_json(messages).decode(),
                "expires_at": expires_at,
            }
            for handle, messages in first.items()
        ]
        with self._write(f"offload to {key}") as conn:
            # An expired handle is absent: purge the conversation's expired rows first.
            conn.execute(delete(offload).where(self._where(offload, key), offload.c.expires_at <= now))
            # RETURNING names the rows this statement inserted: exactly the handles that were
            # absent, even with a concurrent writer (its rows conflict and are skipped).
            inserted = set(
                conn.execute(
                    self._insert(conn, offload)
                    .values(rows)
                    .on_conflict_do_nothing(
                        index_elements=[offload.c.tenant_id, offload.c.conversation_id, offload.c.handle]
                    )
                    .returning(offload.c.handle)
                ).scalars()
            )
        written: list[bool] = []
        for handle, _ in items:
            written.append(handle in inserted)
            inserted.discard(handle)  # a repeat of a handle is not written again
        return written

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None (also once expired)."""
        validate_handle(handle)
        offload = self._t.offload
        live = or_(offload.c.expires_at.is_(None), offload.c.expires_at > time.time())
        query = select(offload.c.data).where(self._where(offload, key), offload.c.handle == handle, live)
        with self._read(f"read offload of {key}") as conn:
            data = conn.execute(query).scalar_one_or_none()
        return messages_from_json(data) if data is not None else None

    files = no_files

    def delete(self, key: ConversationKey) -> None:
        """Remove every offload of the conversation."""
        self._delete_all(f"delete offloads of {key}", key, self._t.offload)
