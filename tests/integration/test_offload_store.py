"""The OffloadStore contract, once, against every backend (memory, files, Redis, SQLite, PostgreSQL)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxcore.errors import InvalidKeyError, StoreUnavailable
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage
from ctxcore.state import ConversationKey, OffloadStore, RedisOffloadStore, SqlOffloadStore
from tests.conftest import BACKENDS, Backend

HANDLE, OTHER_HANDLE = "0123456789abcdef", "fedcba9876543210"


@pytest.fixture(params=[*BACKENDS, pytest.param("filesystem", id="filesystem")])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return Backend(request.param, request, tmp_path)


@pytest.fixture
def store(backend: Backend) -> OffloadStore:
    return backend.offloads()


def originals(text: str = "x" * 2000) -> list[AnyMessage]:
    return [
        AssistantMessage(content=None, tool_calls=[ToolCall(id="c1", name="grep", arguments='{"q": "é"}')]),
        ToolMessage(
            content=text, tool_call_id="c1", metadata={"is_error": False}, context_message_id="000000000007"
        ),
    ]


def test_round_trip(store: OffloadStore, conv_key: ConversationKey) -> None:
    assert store.get(conv_key, HANDLE) is None
    assert store.put_if_absent(conv_key, HANDLE, originals()) is True
    assert store.get(conv_key, HANDLE) == originals()


def test_first_write_wins(store: OffloadStore, conv_key: ConversationKey) -> None:
    assert store.put_if_absent(conv_key, HANDLE, originals("first")) is True
    assert store.put_if_absent(conv_key, HANDLE, originals("second")) is False
    assert store.get(conv_key, HANDLE) == originals("first")


def test_concurrent_puts_write_once(store: OffloadStore, conv_key: ConversationKey) -> None:
    threads = 8
    barrier = threading.Barrier(threads)
    results: list[bool] = []

    def put(index: int) -> None:
        barrier.wait()
        results.append(store.put_if_absent(conv_key, HANDLE, originals(f"writer {index}")))

    pool = [threading.Thread(target=put, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert sorted(results) == [False] * (threads - 1) + [True]
    stored = store.get(conv_key, HANDLE)
    assert stored is not None and stored[1].text.startswith("writer ")


def test_delete_removes_only_that_conversation(store: OffloadStore, tenant: str) -> None:
    a, b = ConversationKey(tenant, "a"), ConversationKey(tenant, "b")
    other_tenant = ConversationKey(f"{tenant}-x", "a")
    for key in (a, b, other_tenant):
        assert store.put_if_absent(key, HANDLE, originals(str(key)))
    assert store.put_if_absent(a, OTHER_HANDLE, originals())
    store.delete(a)
    assert store.get(a, HANDLE) is None and store.get(a, OTHER_HANDLE) is None
    assert store.get(b, HANDLE) == originals(str(b))
    assert store.get(other_tenant, HANDLE) == originals(str(other_tenant))
    # A deleted handle can be written again
    assert store.put_if_absent(a, HANDLE, originals("again")) is True


def test_put_many_matches_put_if_absent_one_at_a_time(store: OffloadStore, conv_key: ConversationKey) -> None:
    third = "00112233aabbccdd"
    assert store.put_if_absent(conv_key, HANDLE, originals("kept"))
    items = [(HANDLE, originals("lost")), (OTHER_HANDLE, originals("b")), (OTHER_HANDLE, originals("c"))]
    items.append((third, originals("d")))
    # The batch path of every backend
    assert store.put_many_if_absent(conv_key, items) == [False, True, False, True]
    assert store.get(conv_key, HANDLE) == originals("kept")
    assert store.get(conv_key, OTHER_HANDLE) == originals("b")
    assert store.get(conv_key, third) == originals("d")
    assert store.put_many_if_absent(conv_key, []) == []


def test_put_many_rejects_an_invalid_handle(store: OffloadStore, conv_key: ConversationKey) -> None:
    with pytest.raises(InvalidKeyError):
        store.put_many_if_absent(conv_key, [(HANDLE, originals()), ("../../x", originals())])


def test_invalid_handles_are_rejected(store: OffloadStore, conv_key: ConversationKey) -> None:
    for bad in ("../../etc/passwd", "ABCDEF12", "abc", "x" * 65, "0123456789abcdeg"):
        with pytest.raises(InvalidKeyError):
            store.put_if_absent(conv_key, bad, originals())
        with pytest.raises(InvalidKeyError):
            store.get(conv_key, bad)


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] != "memory"], indirect=True)
def test_ttl_expires_offloads(backend: Backend, conv_key: ConversationKey) -> None:
    store = backend.offloads(ttl_seconds=0.3)
    assert store.put_if_absent(conv_key, HANDLE, originals("old")) is True
    assert store.get(conv_key, HANDLE) == originals("old")
    time.sleep(0.6)
    # Expired: gone, and the handle is free again
    assert store.get(conv_key, HANDLE) is None
    assert store.put_if_absent(conv_key, HANDLE, originals("new")) is True
    assert store.get(conv_key, HANDLE) == originals("new")


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] != "memory"], indirect=True)
def test_ttl_of_a_batch(backend: Backend, conv_key: ConversationKey) -> None:
    store = backend.offloads(ttl_seconds=0.3)
    assert store.put_many_if_absent(conv_key, [(HANDLE, originals("a")), (OTHER_HANDLE, originals("b"))]) == [
        True,
        True,
    ]
    time.sleep(0.6)
    assert store.get(conv_key, HANDLE) is None and store.get(conv_key, OTHER_HANDLE) is None
    assert store.put_many_if_absent(conv_key, [(HANDLE, originals("new"))]) == [True]


def test_redis_unreachable_raises_store_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    store = RedisOffloadStore(client, prefix="ctxcore-test-unreachable")
    with pytest.raises(StoreUnavailable) as info:
        store.put_if_absent(ConversationKey("t", "c"), HANDLE, originals())
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_sqlite_on_unwritable_path_raises_store_unavailable(tmp_path: Path) -> None:
    store = SqlOffloadStore(f"sqlite:///{tmp_path / 'missing-dir' / 'ctx.db'}")
    with pytest.raises(StoreUnavailable):
        store.get(ConversationKey("t", "c"), HANDLE)


@pytest.mark.parametrize(
    "backend", [p for p in BACKENDS if p.values[0] in ("sqlite", "postgres")], indirect=True
)
def test_a_sql_batch_is_one_insert(backend: Backend, conv_key: ConversationKey) -> None:
    from sqlalchemy import event

    store = backend.offloads()
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement.split()[0].upper())

    engine = store._engine  # type: ignore[attr-defined]  # the test counts the store's own statements
    event.listen(engine, "before_cursor_execute", seen)
    try:
        handles = [f"{n:016x}" for n in range(20)]
        assert store.put_many_if_absent(conv_key, [(h, originals(h)) for h in handles]) == [True] * 20
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert statements.count("INSERT") == 1, statements
    assert store.get(conv_key, handles[-1]) == originals(handles[-1])
