"""Retention on SQL: find and delete conversations idle for longer than their retention.

A conversation's activity is ``last_active_at`` on its counter row (stamped by appends) and
on its budget row (stamped by windows, which upsert it anyway), each at most hourly
(``ACTIVITY_RESOLUTION_SECONDS``). A conversation is idle when neither is at or after its
tenant's cutoff; the workers' sweep (``workers.retention``) deletes it, all its rows in one
transaction that re-checks both stamps under the counter row's lock, so an append racing
the sweep either lands first (and keeps the conversation) or starts a new one after.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import ColumnElement, Table, and_, delete, exists, select, union

from ctxcore.state.keys import ConversationKey
from ctxcore.state.retention import Retention
from ctxcore.state.sql.engine import SqlBackend

__all__ = ["SqlRetentionSweep"]


class SqlRetentionSweep(SqlBackend):
    """The SQL half of the retention sweep, over one engine and table prefix."""

    def _idle_in(
        self, table: Table, other: Table, cutoff: float, tenant: ColumnElement[bool] | None
    ) -> ColumnElement[bool]:
        same = and_(
            other.c.tenant_id == table.c.tenant_id, other.c.conversation_id == table.c.conversation_id
        )
        fresh = exists().where(same, other.c.last_active_at >= cutoff)
        condition = and_(table.c.last_active_at < cutoff, ~fresh)
        return and_(condition, tenant) if tenant is not None else condition

    def idle(
        self,
        cutoff: float,
        *,
        tenant_id: str | None = None,
        other_than: Collection[str] = (),
        limit: int = 500,
    ) -> list[ConversationKey]:
        """Up to ``limit`` conversations whose activity is all before ``cutoff`` (epoch s):
        of ``tenant_id`` when given, else of every tenant but ``other_than``."""
        selects = []
        pairs = ((self._t.log_counter, self._t.budget), (self._t.budget, self._t.log_counter))
        for table, other in pairs:
            if tenant_id is not None:
                scope: ColumnElement[bool] | None = table.c.tenant_id == tenant_id
            elif other_than:
                scope = table.c.tenant_id.not_in(sorted(other_than))
            else:
                scope = None
            selects.append(
                select(table.c.tenant_id, table.c.conversation_id).where(
                    self._idle_in(table, other, cutoff, scope)
                )
            )
        query = union(*selects).limit(limit)
        with self._read("find idle conversations") as conn:
            rows = conn.execute(query).all()
        return sorted(ConversationKey(row[0], row[1]) for row in rows)

    def idle_by_retention(
        self, retention: Retention, *, limit: int = 500
    ) -> list[tuple[ConversationKey, float]]:
        """Idle conversations under ``retention`` (per tenant), each with its cutoff."""
        now = self._clock()
        out: list[tuple[ConversationKey, float]] = []
        for tenant, seconds in sorted(retention.tenants.items()):
            cutoff = now - seconds
            out += [(k, cutoff) for k in self.idle(cutoff, tenant_id=tenant, limit=limit)]
        if retention.seconds is not None:
            cutoff = now - retention.seconds
            out += [(k, cutoff) for k in self.idle(cutoff, other_than=set(retention.tenants), limit=limit)]
        return out

    def delete_if_idle(self, key: ConversationKey, cutoff: float) -> bool:
        """Delete every row of ``key`` if its activity is still all before ``cutoff`` (one
        transaction under the counter row's lock); False when it was active meanwhile."""
        counter, budget = self._t.log_counter, self._t.budget
        with self._write(f"expire {key}") as conn:
            stamps = [
                conn.execute(
                    select(counter.c.last_active_at).where(self._where(counter, key)).with_for_update()
                )
                .scalars()
                .all(),
                conn.execute(select(budget.c.last_active_at).where(self._where(budget, key))).scalars().all(),
            ]
            found = [s for rows in stamps for s in rows]
            if not found or any(s is None or s >= cutoff for s in found):
                return False
            for table in self._t.conversation_tables():
                conn.execute(delete(table).where(self._where(table, key)))
        return True
