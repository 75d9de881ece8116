"""The SQL window read: one statement per window, the budget upserted only when it changed
or the retention's activity stamp is due (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from ctxcore.config import Settings
from ctxcore.recall import ChunkingConfig, archive_messages
from ctxcore.state import ConversationKey, SqlMessageLog, SqlStateStore
from ctxcore.state.models import CompressionState
from ctxcore.state.retention import ACTIVITY_RESOLUTION_SECONDS
from ctxcore.state.sql.window import SqlWindowReader
from ctxcore.tokens import TiktokenCounter
from tests.conftest import sql_engine_for
from tests.integration.test_retention_sql import FakeClock
from tests.unit.test_window_tail import SYSTEM, PlainLog, agent_run, recorded
from workers.service import ContextService, InlineQueue


@dataclass
class Sql:
    state: SqlStateStore
    log: SqlMessageLog
    clock: FakeClock
    key: ConversationKey
    statements: list[str] = field(default_factory=list)

    def service(self, settings: Settings | None = None) -> ContextService:
        return ContextService(settings or Settings(), self.state, self.log, None, InlineQueue())

    def plain(self) -> ContextService:
        """The same stores read one call at a time (no window reader)."""
        return ContextService(Settings(), self.state, PlainLog(self.log), None, InlineQueue())  # type: ignore[arg-type]

    def reader(self, service: ContextService) -> SqlWindowReader:
        reader = service._window_reader
        assert isinstance(reader, SqlWindowReader)
        return reader

    def ids(self) -> list[str]:
        return [m.context_message_id or "" for m in self.log.read_after(self.key, None)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sql]:
    clock = FakeClock()
    engine, prefix = sql_engine_for(request, tmp_path)
    found = Sql(
        SqlStateStore(engine=engine, table_prefix=prefix, clock=clock),
        SqlMessageLog(engine=engine, table_prefix=prefix, clock=clock),
        clock,
        ConversationKey(f"tenant-{uuid.uuid4().hex[:12]}", "conv-1"),
    )

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        found.statements.append(statement.split(None, 1)[0].upper())

    sqlalchemy.event.listen(engine, "before_cursor_execute", record)
    yield found
    sqlalchemy.event.remove(engine, "before_cursor_execute", record)


def windows_match(a: Any, b: Any) -> bool:
    return bool(a.messages == b.messages and a.stats == b.stats and a.raw_tokens == b.raw_tokens)


def test_a_window_is_one_statement_and_the_budget_is_written_when_it_changes(sql: Sql) -> None:
    service, plain = sql.service(), sql.plain()
    for batch in agent_run(20, user_at=5):
        service.append(sql.key, batch)
    ids = sql.ids()
    assert sql.state.save(sql.key, CompressionState(covered_until=ids[10], pinned=[ids[0]]), 0)
    service.get_window(sql.key, 50_000, SYSTEM)  # records the budget
    sql.statements.clear()
    window = service.get_window(sql.key, 50_000, SYSTEM)
    assert sql.statements == ["SELECT"]
    assert windows_match(window, plain.get_window(sql.key, 50_000, SYSTEM))
    assert str(window.messages[1].content).startswith("Fix the failing build")  # the pinned task
    sql.statements.clear()
    service.get_window(sql.key, 40_000, SYSTEM)  # a new budget: read, then the upsert
    assert sql.statements[0] == "SELECT" and "INSERT" in sql.statements
    assert sql.state.get_budget(sql.key) == recorded(40_000)
    sql.statements.clear()
    sql.clock.now += ACTIVITY_RESOLUTION_SECONDS + 1  # the retention's activity stamp is due
    service.get_window(sql.key, 40_000, SYSTEM)
    assert "INSERT" in sql.statements
    assert sql.reader(service).tail_reads == 0


def test_a_state_saved_before_the_head_row_held_its_cursor_is_read_the_old_way(sql: Sql) -> None:
    service, plain = sql.service(), sql.plain()
    for batch in agent_run(20):
        service.append(sql.key, batch)
    ids = sql.ids()
    assert sql.state.save(sql.key, CompressionState(covered_until=ids[8], pinned=[ids[0]]), 0)
    head, pinned = sql.state._t.state, sql.state._t.state_pinned
    with sql.state.engine.begin() as conn:  # as the migration leaves a state saved before it
        conn.execute(
            sqlalchemy.update(head).where(head.c.tenant_id == sql.key.tenant_id).values(covered_seq=None)
        )
        conn.execute(sqlalchemy.delete(pinned).where(pinned.c.tenant_id == sql.key.tenant_id))
    window = service.get_window(sql.key, 50_000, SYSTEM)
    assert windows_match(window, plain.get_window(sql.key, 50_000, SYSTEM))
    assert str(window.messages[1].content).startswith("Fix the failing build")
    assert sql.reader(service).tail_reads == 1
    assert sql.state.cursor(sql.key) == ids[8]  # from the state, as the window reads it
    assert sql.state.save(sql.key, CompressionState(covered_until=ids[10], pinned=[ids[0]]), 1)
    window = service.get_window(sql.key, 50_000, SYSTEM)  # saved again: the one statement
    assert windows_match(window, plain.get_window(sql.key, 50_000, SYSTEM))
    assert sql.reader(service).tail_reads == 1


def test_a_tail_longer_than_a_page_is_read_newest_first(sql: Sql) -> None:
    service, plain = sql.service(), sql.plain()
    for batch in agent_run(200, user_at=50):
        service.append(sql.key, batch)
    window = service.get_window(sql.key, 4_000, SYSTEM)
    expected = plain.get_window(sql.key, 4_000, SYSTEM)
    assert window.raw_tokens == expected.raw_tokens and window.messages[-1] == expected.messages[-1]
    assert window.stats.total_tokens <= 4_000 and window.fallback_applied
    assert "now also check module 50" in [str(m.content) for m in window.messages]
    assert sql.reader(service).tail_reads == 1


def test_the_recall_index_comes_with_the_statement_only_when_newer(sql: Sql) -> None:
    settings = Settings.load({"recall": {"enabled": True, "auto": True}})
    service = sql.service(settings)
    for batch in agent_run(30, user_at=3):
        service.append(sql.key, batch)
    logged = sql.log.read_after(sql.key, None)
    index, write = archive_messages(None, logged[:40], TiktokenCounter(), ChunkingConfig())
    assert write is not None
    saved = CompressionState(covered_until=logged[39].context_message_id, archive_version=write.version)
    assert sql.state.save(sql.key, saved, 0, archive=write)
    service.get_window(sql.key, 50_000, SYSTEM)
    assert service._indexes.version(sql.key) == index.version
    for _ in range(2):
        sql.statements.clear()
        service.get_window(sql.key, 50_000, SYSTEM)
        assert sql.statements == ["SELECT"]


def test_a_conversation_without_log_or_state_is_not_found_and_nothing_is_written(sql: Sql) -> None:
    from ctxcore.errors import NotFoundError

    service = sql.service()
    sql.statements.clear()
    with pytest.raises(NotFoundError):
        service.get_window(sql.key, 1_000, SYSTEM, require_existing=True)
    assert sql.statements == ["SELECT"] and sql.state.get_budget(sql.key) is None
