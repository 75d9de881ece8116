"""The StateStore contract, once, against every backend (memory, Redis, SQLite, PostgreSQL)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import event

from ctxcore.errors import StoreError, StoreUnavailable
from ctxcore.messages import AssistantMessage, ToolCall, UserMessage
from ctxcore.state import (
    HISTORY_LIMIT,
    CompressionState,
    ConversationKey,
    RedisStateStore,
    SqlStateStore,
    StateStore,
    SummaryBlock,
)
from tests.conftest import Backend, drop_postgres_tables


@pytest.fixture
def store(backend: Backend) -> StateStore:
    return backend.state


def rich_state(covered_until: str = "000000000004") -> CompressionState:
    """A state with a block holding real messages, pinned anchors and metadata."""
    block = SummaryBlock(
        block_id="b-1",
        messages=[
            UserMessage(
                content="<memory_block_round>did X, then Y ✓ 漢字</memory_block_round>",
                metadata={"k": [1, 2]},
            ),
            AssistantMessage(content=None, tool_calls=[ToolCall(id="c1", name="ls", arguments='{"p": "/"}')]),
        ],
        first_id="000000000002",
        last_id=covered_until,
        level=2,
        tokens_before=1200,
        tokens_after=80,
        model="extractive",
        created_at=datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    )
    return CompressionState(
        blocks=[block], covered_until=covered_until, pinned=["000000000001"], meta={"a": "b"}
    )


def test_load_of_unknown_conversation_is_none(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.load(conv_key) is None
    assert store.history(conv_key) == []


def test_round_trip_keeps_every_field_and_numbers_the_version(
    store: StateStore, conv_key: ConversationKey
) -> None:
    # Given a state whose own version field says something else
    state = rich_state().model_copy(update={"version": 41})
    # When it is saved as the first version
    assert store.save(conv_key, state, expected_version=0) is True
    # Then it comes back equal, as version 1 (the store numbers versions, not the caller)
    loaded = store.load(conv_key)
    assert loaded == state.model_copy(update={"version": 1})
    assert loaded is not None and loaded.blocks[0].messages[1].tool_calls[0].arguments == '{"p": "/"}'


def test_stale_version_is_rejected_and_state_unchanged(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.save(conv_key, rich_state("000000000004"), 0)
    assert store.save(conv_key, rich_state("000000000006"), 1)
    # A writer that read version 1 lost the race: False, not an exception, not an overwrite.
    assert store.save(conv_key, rich_state("000000000009"), 1) is False
    # Expecting a version that does not exist yet is also a conflict.
    assert store.save(conv_key, rich_state("000000000009"), 7) is False
    loaded = store.load(conv_key)
    assert loaded is not None and (loaded.version, loaded.covered_until) == (2, "000000000006")


def test_second_first_insert_loses(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.save(conv_key, rich_state("000000000004"), 0) is True
    assert store.save(conv_key, rich_state("000000000005"), 0) is False
    loaded = store.load(conv_key)
    assert loaded is not None and (loaded.version, loaded.covered_until) == (1, "000000000004")


def test_history_keeps_the_last_twenty_newest_first(store: StateStore, conv_key: ConversationKey) -> None:
    for version in range(25):
        assert store.save(conv_key, CompressionState(meta={"n": version + 1}), version)
    kept = store.history(conv_key)
    assert [s.version for s in kept] == list(range(25, 25 - HISTORY_LIMIT, -1))
    assert [s.meta["n"] for s in kept] == [s.version for s in kept]
    assert [s.version for s in store.history(conv_key, limit=3)] == [25, 24, 23]
    assert store.history(conv_key, limit=0) == []


def test_rollback_saves_an_old_version_as_a_new_one(store: StateStore, conv_key: ConversationKey) -> None:
    for version in range(25):
        assert store.save(conv_key, CompressionState(covered_until=f"{version + 1:012d}"), version)
    # Stale expectation: a conflict, nothing written
    assert store.rollback(conv_key, to_version=10, expected_version=24) is False
    # Then a real rollback to version 10
    assert store.rollback(conv_key, to_version=10, expected_version=25) is True
    loaded = store.load(conv_key)
    assert loaded is not None and (loaded.version, loaded.covered_until) == (26, "000000000010")
    # The rolled-back-from version is still in the history: a rollback rewrites nothing.
    assert [s.version for s in store.history(conv_key, limit=3)] == [26, 25, 24]
    assert store.history(conv_key)[1].covered_until == "000000000025"
    # A version no longer kept cannot be restored
    with pytest.raises(StoreError, match="not kept"):
        store.rollback(conv_key, to_version=3, expected_version=26)


def test_budget_is_a_plain_write_without_version_bump(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.get_budget(conv_key) is None
    store.set_budget(conv_key, 8000)  # before any state exists
    assert store.get_budget(conv_key) == 8000
    assert store.load(conv_key) is None
    assert store.save(conv_key, rich_state(), 0)
    store.set_budget(conv_key, 16000)
    assert store.get_budget(conv_key) == 16000
    loaded = store.load(conv_key)
    assert loaded is not None and loaded.version == 1
    assert len(store.history(conv_key)) == 1
    with pytest.raises(ValueError, match="positive"):
        store.set_budget(conv_key, 0)


def test_cursor_is_the_current_states_covered_until(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.cursor(conv_key) is None  # no state
    assert store.save(conv_key, CompressionState(), 0)
    assert store.cursor(conv_key) is None  # a state that covers nothing
    assert store.save(conv_key, rich_state("000000000004"), 1)
    assert store.cursor(conv_key) == "000000000004"
    assert store.save(conv_key, rich_state("000000000009"), 2)
    assert (
        store.cursor(conv_key) == "000000000009" == (store.load(conv_key) or CompressionState()).covered_until
    )
    assert store.rollback(conv_key, to_version=2, expected_version=3)
    assert store.cursor(conv_key) == "000000000004"
    store.delete(conv_key)
    assert store.cursor(conv_key) is None


def test_delete_removes_state_history_and_budget(store: StateStore, conv_key: ConversationKey) -> None:
    other = ConversationKey(conv_key.tenant_id, "conv-2")
    for k in (conv_key, other):
        assert store.save(k, rich_state(), 0)
        assert store.save(k, rich_state(), 1)
        store.set_budget(k, 1000)
    store.delete(conv_key)
    assert store.load(conv_key) is None
    assert store.history(conv_key) == []
    assert store.get_budget(conv_key) is None
    # A deleted conversation starts again from version 0; its neighbour is untouched.
    assert store.save(conv_key, rich_state(), 0) is True
    loaded = store.load(other)
    assert loaded is not None and loaded.version == 2 and store.get_budget(other) == 1000


def test_tenants_are_isolated(store: StateStore, tenant: str) -> None:
    mine, theirs = ConversationKey(tenant, "shared-id"), ConversationKey(f"{tenant}-b", "shared-id")
    assert store.save(mine, rich_state("000000000004"), 0)
    store.set_budget(mine, 500)
    assert store.load(theirs) is None and store.get_budget(theirs) is None
    assert store.save(theirs, rich_state("000000000007"), 0) is True
    store.delete(theirs)
    loaded = store.load(mine)
    assert loaded is not None and loaded.covered_until == "000000000004" and store.get_budget(mine) == 500


def test_concurrent_saves_exactly_one_wins_every_round(store: StateStore, conv_key: ConversationKey) -> None:
    # 16 threads save from the same version, 200 rounds (round 0 is the first-insert race).
    threads, rounds = 16, 200
    barrier = threading.Barrier(threads)
    results = [[False] * threads for _ in range(rounds)]
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait()
                results[r][index] = store.save(conv_key, CompressionState(meta={"w": index, "r": r}), r)
                barrier.wait()  # nobody starts round r + 1 before round r is settled
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    pool = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    assert [sum(round_results) for round_results in results] == [1] * rounds
    loaded = store.load(conv_key)
    assert loaded is not None and loaded.version == rounds
    # The stored state is the winner's of the last round.
    assert loaded.meta == {"w": results[-1].index(True), "r": rounds - 1}


@pytest.mark.timeout(20)
def test_redis_unreachable_raises_store_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    store = RedisStateStore(client, prefix="ctxcore-test-unreachable")
    key = ConversationKey("t", "c")
    for call in (
        lambda: store.load(key),
        lambda: store.save(key, CompressionState(), 0),
        lambda: store.set_budget(key, 10),
    ):
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_sqlite_on_unwritable_path_raises_store_unavailable(tmp_path: Path) -> None:
    store = SqlStateStore(f"sqlite:///{tmp_path / 'missing-dir' / 'ctx.db'}")
    with pytest.raises(StoreUnavailable) as info:
        store.setup()
    assert info.value.__cause__ is not None
    with pytest.raises(StoreUnavailable):
        store.load(ConversationKey("t", "c"))


@pytest.mark.timeout(20)
def test_postgres_unreachable_raises_store_unavailable() -> None:
    store = SqlStateStore("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")
    with pytest.raises(StoreUnavailable) as info:
        store.load(ConversationKey("t", "c"))
    assert info.value.__cause__ is not None


def test_sql_setup_is_idempotent_and_records_migrations(tmp_path: Path) -> None:
    store = SqlStateStore(f"sqlite:///{tmp_path / 'ctx.db'}", table_prefix="app_")
    store.setup()
    store.setup()
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT version, name FROM app_schema_migrations ORDER BY version").all()
    assert [r.version for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 3
    key = ConversationKey("t", "c")
    assert store.save(key, CompressionState(), 0)
    store.close()


def test_sql_in_memory_database_is_shared_by_threads() -> None:
    store = SqlStateStore("sqlite://")
    store.setup()
    key = ConversationKey("t", "c")
    outcomes: list[bool] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(store.save(key, CompressionState(), 0)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [False, False, False, True]
    store.close()


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_concurrent_setup_from_several_processes(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Each store has its own engine, as separate processes would; all migrate a new schema.
    prefix = f"Ctxcore_Setup_{uuid.uuid4().hex[:8]}_"  # capitals: table names must be quoted alike
    if database == "postgres":
        url = request.getfixturevalue("postgres_url")
        request.addfinalizer(lambda: drop_postgres_tables(stores[0].engine, prefix))
    else:
        url = f"sqlite:///{tmp_path / 'ctx.db'}"
    stores = [SqlStateStore(url, table_prefix=prefix) for _ in range(6)]
    for store in stores:
        request.addfinalizer(store.close)
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def setup(store: SqlStateStore) -> None:
        try:
            barrier.wait()
            store.setup()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=setup, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    with stores[0].engine.connect() as conn:
        versions = conn.exec_driver_sql(f'SELECT version FROM "{prefix}schema_migrations"').scalars().all()
    assert sorted(versions) == list(range(1, len(versions) + 1))
    assert stores[1].save(ConversationKey("t", "c"), CompressionState(), 0) is True


def test_sqlite_write_transactions_begin_immediate(tmp_path: Path) -> None:
    # IMMEDIATE takes the write lock at BEGIN, so a writer waits (busy_timeout) instead of
    # failing on a read-to-write lock upgrade; reads stay DEFERRED and do not block writers.
    store = SqlStateStore(f"sqlite:///{tmp_path / 'ctx.db'}")
    store.setup()
    seen: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: seen.append(args[2].split()[0:2]))
    key = ConversationKey("t", "c")
    store.save(key, CompressionState(), 0)
    store.set_budget(key, 100)
    store.load(key)
    begins = [" ".join(words) for words in seen if words[0] == "BEGIN"]
    assert begins == ["BEGIN IMMEDIATE", "BEGIN IMMEDIATE", "BEGIN"]
    store.close()
