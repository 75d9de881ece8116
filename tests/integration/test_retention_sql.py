"""Retention on SQL: ``last_active_at`` stamped by appends and windows, and the sweep that
deletes idle conversations, on a fake clock (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy

from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, SqlMessageLog, SqlOffloadStore, SqlStateStore
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite
from ctxcore.state.models import CompressionState
from ctxcore.state.retention import Retention
from ctxcore.state.sql.retention import SqlRetentionSweep
from ctxcore.state.sql.schema import Tables
from tests.conftest import sql_engine_for

DAY = 86400.0


class FakeClock:
    """Epoch seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Stores:
    state: SqlStateStore
    log: SqlMessageLog
    offloads: SqlOffloadStore
    sweep: SqlRetentionSweep
    clock: FakeClock
    tenant: str

    def key(self, conversation: str, tenant: str | None = None) -> ConversationKey:
        return ConversationKey(tenant or self.tenant, conversation)

    def fill(self, key: ConversationKey) -> None:
        """A conversation with a row in every table."""
        self.log.append(key, [UserMessage(content="hello")])
        self.log.counted().store_counts(key, "o200k_base", {"000000000001": 3})
        chunk = ArchiveChunk("000000000001", "000000000001", "hello", 1)
        assert self.state.save(key, CompressionState(), 0, archive=ArchiveWrite((chunk,), b"index", 1))
        self.state.set_budget(key, 1000)
        assert self.offloads.put_if_absent(key, "0123456789abcdef", [UserMessage(content="x")])

    def rows(self, key: ConversationKey) -> int:
        tables = Tables.for_prefix(self.state.table_prefix)
        total = 0
        with self.state.engine.connect() as conn:
            for table in tables.conversation_tables():
                query = sqlalchemy.select(sqlalchemy.func.count()).where(
                    table.c.tenant_id == key.tenant_id, table.c.conversation_id == key.conversation_id
                )
                total += int(conn.execute(query).scalar_one())
        return total


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    clock = FakeClock()
    engine, prefix = sql_engine_for(request, tmp_path)
    yield Stores(
        SqlStateStore(engine=engine, table_prefix=prefix, clock=clock),
        SqlMessageLog(engine=engine, table_prefix=prefix, clock=clock),
        SqlOffloadStore(engine=engine, table_prefix=prefix, clock=clock),
        SqlRetentionSweep(engine=engine, table_prefix=prefix, clock=clock),
        clock,
        f"tenant-{uuid.uuid4().hex[:12]}",
    )


def _expire(s: Stores, retention: Retention) -> list[ConversationKey]:
    """One sweep pass (SQL half): the conversations deleted, of this test's tenants only."""
    deleted = []
    for key, cutoff in s.sweep.idle_by_retention(retention, limit=10_000):
        if key.tenant_id.startswith(s.tenant) and s.sweep.delete_if_idle(key, cutoff):
            deleted.append(key)
    return sorted(deleted)


def test_idle_conversations_are_deleted_after_their_retention(stores: Stores) -> None:
    s, retention = stores, Retention(seconds=10 * DAY)
    quiet, windowed, appended = s.key("quiet"), s.key("windowed"), s.key("appended")
    for key in (quiet, windowed, appended):
        s.fill(key)
    s.clock.now += 5 * DAY
    s.state.set_budget(windowed, 2000)  # a window is activity
    s.clock.now += 4 * DAY
    s.log.append(appended, [UserMessage(content="again")])  # so is an append
    s.clock.now += 1 * DAY + 60  # 10 days after the first writes
    assert _expire(s, retention) == [quiet]
    assert s.rows(quiet) == 0
    assert s.log.last_id(quiet) is None and s.state.load(quiet) is None
    assert s.rows(windowed) > 0 and s.rows(appended) > 0
    s.clock.now += 5 * DAY  # 10 days after the window
    assert _expire(s, retention) == [windowed]
    s.clock.now += 4 * DAY
    assert _expire(s, retention) == [appended]
    assert s.log.list_conversations(s.tenant) == []


def test_a_window_stamps_at_most_hourly(stores: Stores) -> None:
    s = stores
    key = s.key("c")
    s.fill(key)
    first = s.clock.now
    s.clock.now += 600
    s.state.set_budget(key, 1000)
    s.log.append(key, [UserMessage(content="more")])
    tables = Tables.for_prefix(s.state.table_prefix)

    def stamps() -> list[float]:
        with s.state.engine.connect() as conn:
            return [
                float(
                    conn.execute(
                        sqlalchemy.select(t.c.last_active_at).where(t.c.tenant_id == s.tenant)
                    ).scalar_one()
                )
                for t in (tables.log_counter, tables.budget)
            ]

    assert stamps() == [first, first]  # ten minutes later: unchanged (no index churn)
    s.clock.now = first + 3601
    s.state.set_budget(key, 1000)
    s.log.append(key, [UserMessage(content="more")])
    assert stamps() == [first + 3601, first + 3601]


def test_tenant_overrides_and_the_race_with_an_append(stores: Stores) -> None:
    s = stores
    short, default = s.key("c", f"{s.tenant}-short"), s.key("c")
    retention = Retention(seconds=10 * DAY, tenants={short.tenant_id: 1 * DAY})
    s.fill(short)
    s.fill(default)
    s.clock.now += 2 * DAY
    found = dict(s.sweep.idle_by_retention(retention, limit=10_000))
    assert short in found and default not in found
    # Activity between finding the conversation and deleting it keeps it.
    s.log.append(short, [UserMessage(content="just in time")])
    assert s.sweep.delete_if_idle(short, found[short]) is False
    assert s.rows(short) > 0
