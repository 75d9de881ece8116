"""The MessageLog contract, once, against every backend (memory, Redis, SQLite, PostgreSQL)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxcore.errors import (
    ConflictError,
    InvalidKeyError,
    InvalidMessageError,
    StoreUnavailable,
    TruncateRefused,
)
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    UserMessage,
    from_openai,
)
from ctxcore.state import ConversationKey, MessageLog, RedisMessageLog, SqlMessageLog
from tests.conftest import Backend
from tests.datasets import conversations


@pytest.fixture
def log(backend: Backend) -> MessageLog:
    return backend.log


def users(*texts: str) -> list[AnyMessage]:
    return [UserMessage(content=t) for t in texts]


def without_log_ids(messages: list[AnyMessage]) -> list[AnyMessage]:
    return [m.model_copy(update={"context_message_id": None}) for m in messages]


def test_ids_are_fixed_width_in_append_order(log: MessageLog, conv_key: ConversationKey) -> None:
    first = log.append(conv_key, users("a", "b"))
    second = log.append(conv_key, users(*(f"m{i}" for i in range(10))))
    ids = first + second
    assert ids[:3] == ["000000000001", "000000000002", "000000000003"]
    assert all(len(i) == 12 and i.isdigit() for i in ids)
    # String order is append order, also across the 9 -> 10 digit boundary.
    assert ids == sorted(ids) and len(set(ids)) == 12 and ids[-1] == "000000000012"
    assert log.last_id(conv_key) == "000000000012"


def test_round_trip_of_real_conversations(log: MessageLog, tenant: str) -> None:
    for n, record in enumerate(conversations(every=40)):
        key = ConversationKey(tenant, f"real-{n}")
        # Given a real conversation (system messages never reach the log), with stale ids
        messages = [m for m in from_openai(record["messages"]) if m.role != "system"]
        messages = [m.model_copy(update={"context_message_id": "stale"}) for m in messages]
        ids = log.append(key, messages)
        # Then every field comes back, with context_message_id = the log id
        stored = log.read_after(key, None)
        assert [m.context_message_id for m in stored] == ids
        assert without_log_ids(stored) == without_log_ids(messages), record["id"]


def test_append_is_idempotent_by_message_id(log: MessageLog, conv_key: ConversationKey) -> None:
    ids = log.append(conv_key, [UserMessage(content="q", message_id="u-1"), AssistantMessage(content="r")])
    # Across batches: a retried message gets its existing id, new ones get new ids
    again = log.append(
        conv_key,
        [UserMessage(content="q (retry)", message_id="u-1"), UserMessage(content="next", message_id="u-2")],
    )
    assert again == [ids[0], "000000000003"]
    # Within a batch: the second occurrence points at the first
    batch = log.append(
        conv_key,
        [
            UserMessage(content="x", message_id="u-3"),
            UserMessage(content="x again", message_id="u-3"),
            UserMessage(content="y", message_id="u-2"),
        ],
    )
    assert batch == ["000000000004", "000000000004", "000000000003"]
    stored = log.read_after(conv_key, None)
    assert [m.text for m in stored] == ["q", "r", "next", "x"]
    assert log.last_id(conv_key) == "000000000004"


def test_reads_by_cursor_range_and_id(log: MessageLog, conv_key: ConversationKey) -> None:
    assert log.last_id(conv_key) is None
    assert log.read_after(conv_key, None) == []
    ids = log.append(conv_key, users(*"abcdef"))
    assert [m.text for m in log.read_after(conv_key, None)] == list("abcdef")
    assert [m.text for m in log.read_after(conv_key, ids[1])] == list("cdef")
    assert [m.text for m in log.read_after(conv_key, ids[1], limit=2)] == list("cd")
    assert log.read_after(conv_key, ids[1], limit=0) == []
    assert log.read_after(conv_key, ids[-1]) == []
    assert [m.text for m in log.read_range(conv_key, ids[1], ids[3])] == list("bcd")
    assert [m.text for m in log.read_range(conv_key, ids[2], ids[2])] == ["c"]
    assert log.read_range(conv_key, ids[3], ids[1]) == []
    found = log.get(conv_key, ids[4])
    assert found is not None and (found.text, found.context_message_id) == ("e", ids[4])
    assert log.get(conv_key, "000000000999") is None
    for bad in ("7", "00000000000x", "0000000000001", "../../etc"):
        with pytest.raises(InvalidKeyError):
            log.read_after(conv_key, bad)


def test_system_message_rejects_the_whole_batch(log: MessageLog, conv_key: ConversationKey) -> None:
    log.append(conv_key, users("before"))
    batch = [
        UserMessage(content="ok", message_id="m-ok"),
        SystemMessage(content="be nice"),
        UserMessage(content="z"),
    ]
    with pytest.raises(InvalidMessageError) as info:
        log.append(conv_key, batch)
    assert (info.value.index, info.value.field) == (1, "role")
    # Nothing of the batch was appended, not even the valid message before the system one
    assert [m.text for m in log.read_after(conv_key, None)] == ["before"]
    assert log.last_id(conv_key) == "000000000001"
    assert log.append(conv_key, [UserMessage(content="ok", message_id="m-ok")]) == ["000000000002"]


def test_empty_append_writes_nothing(log: MessageLog, conv_key: ConversationKey) -> None:
    assert log.append(conv_key, []) == []
    assert log.last_id(conv_key) is None
    assert log.list_conversations(conv_key.tenant_id) == []


def test_list_conversations_pages_in_id_order(log: MessageLog, tenant: str) -> None:
    names = ["c-10", "c-2", "A-upper", "b_1", "c.3"]
    for name in names:
        log.append(ConversationKey(tenant, name), users("hi"))
    log.append(ConversationKey(f"{tenant}-other", "zz-not-mine"), users("hi"))
    expected = sorted(names)  # byte order, on every backend
    pages, after = [], None
    while page := log.list_conversations(tenant, after=after, limit=2):
        pages.append(page)
        after = page[-1]
    assert pages == [expected[0:2], expected[2:4], expected[4:]]
    assert log.list_conversations(tenant) == expected
    assert log.list_conversations(tenant, after=expected[1], limit=100) == expected[2:]


def test_tenants_are_isolated(log: MessageLog, tenant: str) -> None:
    mine, theirs = ConversationKey(tenant, "same-id"), ConversationKey(f"{tenant}-b", "same-id")
    log.append(mine, [UserMessage(content="mine", message_id="dup")])
    # The same message_id under another tenant is a different message
    assert log.append(theirs, [UserMessage(content="theirs", message_id="dup")]) == ["000000000001"]
    log.append(theirs, users("more"))
    assert [m.text for m in log.read_after(mine, None)] == ["mine"]
    assert log.last_id(mine) == "000000000001" and log.last_id(theirs) == "000000000002"
    log.delete(theirs)
    assert [m.text for m in log.read_after(mine, None)] == ["mine"]
    assert log.list_conversations(tenant) == ["same-id"]


def test_delete_removes_the_log_and_its_listing(log: MessageLog, tenant: str) -> None:
    gone, kept = ConversationKey(tenant, "gone"), ConversationKey(tenant, "kept")
    log.append(gone, [UserMessage(content="a", message_id="m1"), AssistantMessage(content="b")])
    log.append(kept, users("c"))
    log.delete(gone)
    assert (
        log.read_after(gone, None) == []
        and log.last_id(gone) is None
        and log.get(gone, "000000000001") is None
    )
    assert log.list_conversations(tenant) == ["kept"]
    # The dedupe index went with it: the same message_id is a new message now
    assert log.append(gone, [UserMessage(content="a2", message_id="m1")]) == ["000000000001"]
    assert [m.text for m in log.read_after(kept, None)] == ["c"]


def test_expected_last_id_edge_cases(log: MessageLog, conv_key: ConversationKey) -> None:
    # An empty log ends nowhere: any expectation is a conflict with last_id None
    with pytest.raises(ConflictError) as info:
        log.append(conv_key, users("x"), expected_last_id="000000000001")
    assert info.value.last_id is None
    assert log.last_id(conv_key) is None
    ids = log.append(conv_key, [UserMessage(content="a", message_id="a"), UserMessage(content="b")])
    # The current last id lets the batch in
    assert log.append(conv_key, users("c"), expected_last_id=ids[-1]) == ["000000000003"]
    # An older id, a future id and ids that are no log ids at all: conflicts naming the end
    for stale in (ids[-1], "000000000099", "000000000000", "3", "not-an-id", ""):
        with pytest.raises(ConflictError) as info:
            log.append(conv_key, users("late"), expected_last_id=stale)
        assert info.value.last_id == "000000000003", stale
    # A replay needs every message's message_id: "c" had none, so it cannot be recognised
    with pytest.raises(ConflictError):
        log.append(conv_key, users("c"), expected_last_id=ids[-1])
    # Known ids that do not follow the expected id are no replay either
    with pytest.raises(ConflictError):
        log.append(conv_key, [UserMessage(content="a", message_id="a")], expected_last_id=ids[-1])
    # A replay whose batch held a duplicate and an older message is recognised
    d = log.append(
        conv_key,
        [
            UserMessage(content="d", message_id="d"),
            UserMessage(content="d again", message_id="d"),
            UserMessage(content="a", message_id="a"),
            UserMessage(content="e", message_id="e"),
        ],
        expected_last_id="000000000003",
    )
    assert d == ["000000000004", "000000000004", "000000000001", "000000000005"]
    log.append(conv_key, users("someone else"))
    replay = [
        UserMessage(content="d", message_id="d"),
        UserMessage(content="d again", message_id="d"),
        UserMessage(content="a", message_id="a"),
        UserMessage(content="e", message_id="e"),
    ]
    assert log.append(conv_key, replay, expected_last_id="000000000003") == d
    # Half a replay (one message new) conflicts and writes nothing
    with pytest.raises(ConflictError):
        log.append(
            conv_key,
            [UserMessage(content="d", message_id="d"), UserMessage(content="f", message_id="f")],
            expected_last_id="000000000003",
        )
    stored = log.read_after(conv_key, None)
    assert [m.text for m in stored] == ["a", "b", "c", "d", "e", "someone else"]


def test_truncate_after_removes_the_newest_and_never_reuses_ids(
    log: MessageLog, conv_key: ConversationKey
) -> None:
    ids = log.append(conv_key, [UserMessage(content=t, message_id=t) for t in ("a", "b", "c", "d")])
    # Nothing above the last id: nothing removed
    assert log.truncate_after(conv_key, ids[-1]) == []
    # The two newest go; the log ends at b
    assert log.truncate_after(conv_key, ids[1]) == ids[2:]
    assert [m.text for m in log.read_after(conv_key, None)] == ["a", "b"]
    assert log.last_id(conv_key) == ids[1] and log.get(conv_key, ids[2]) is None
    # Ids are never reused, and a removed message_id can be appended again
    again = log.append(conv_key, [UserMessage(content="c2", message_id="c"), UserMessage(content="e")])
    assert again == ["000000000005", "000000000006"]
    assert [m.context_message_id for m in log.read_after(conv_key, ids[0])] == [ids[1], *again]
    assert log.read_range(conv_key, ids[1], again[0])[-1].text == "c2"
    # A kept message_id still deduplicates
    assert log.append(conv_key, [UserMessage(content="a", message_id="a")]) == [ids[0]]
    # The cut can fall in a gap; emptying the log leaves no last id, the counter goes on
    assert log.truncate_after(conv_key, "000000000004") == again
    assert log.truncate_after(conv_key, "000000000000") == ids[:2]
    assert log.last_id(conv_key) is None and log.read_after(conv_key, None) == []
    assert log.append(conv_key, users("f")) == ["000000000007"]
    with pytest.raises(InvalidKeyError):
        log.truncate_after(conv_key, "7")


def test_truncate_after_with_expected_last_id_and_appends_over_gaps(
    log: MessageLog, conv_key: ConversationKey
) -> None:
    ids = log.append(conv_key, [UserMessage(content=t, message_id=t) for t in ("a", "b", "c")])
    # The log moved on: nothing is removed
    with pytest.raises(TruncateRefused) as info:
        log.truncate_after(conv_key, ids[0], expected_last_id=ids[1])
    assert info.value.reason == "moved" and info.value.last_id == ids[2]
    assert log.truncate_after(conv_key, ids[1], expected_last_id=ids[2]) == [ids[2]]
    # If-Match now compares against the remaining end, not the counter
    with pytest.raises(ConflictError) as conflict:
        log.append(conv_key, users("x"), expected_last_id=ids[2])
    assert conflict.value.last_id == ids[1]
    first = log.append(conv_key, [UserMessage(content="d", message_id="d")], expected_last_id=ids[1])
    assert first == ["000000000004"]
    # A replay over the gap (3 was removed) is recognised as one
    log.append(conv_key, users("someone else"))
    assert log.append(conv_key, [UserMessage(content="d", message_id="d")], expected_last_id=ids[1]) == first


def test_sqlite_writer_waits_for_a_held_lock(tmp_path: Path) -> None:
    # Given another process's write transaction holding the database lock for a moment
    path = tmp_path / "ctx.db"
    log = SqlMessageLog(f"sqlite:///{path}")
    log.setup()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, other.execute, args=("COMMIT",))
    release.start()
    try:
        # When this process appends, it waits (busy_timeout) instead of failing
        assert log.append(ConversationKey("t", "c"), users("waited")) == ["000000000001"]
    finally:
        release.join()
        other.close()
        log.close()


def test_redis_unreachable_raises_store_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    log = RedisMessageLog(client, prefix="ctxcore-test-unreachable")
    key = ConversationKey("t", "c")
    for call in (
        lambda: log.append(key, users("x")),
        lambda: log.read_after(key, None),
        lambda: log.last_id(key),
    ):
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert isinstance(info.value.__cause__, redis.ConnectionError)


@pytest.mark.redis
def test_redis_client_decoding_responses_works_too(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    log = RedisMessageLog(client, prefix=redis_prefix)
    key = ConversationKey("t", "c")
    assert log.append(key, [UserMessage(content="é", message_id="m"), UserMessage(content="b")]) == [
        "000000000001",
        "000000000002",
    ]
    assert [(m.text, m.context_message_id) for m in log.read_after(key, "000000000001")] == [
        ("b", "000000000002")
    ]
    assert log.last_id(key) == "000000000002" and log.list_conversations("t") == ["c"]
    client.close()


def test_redis_replies_are_parsed_by_hiredis() -> None:
    # A declared dependency: the pure-Python parser was a third of a window's time.
    import redis.utils

    assert redis.utils.HIREDIS_AVAILABLE


def test_read_newest_is_the_end_of_the_log_after_the_cursor(
    log: MessageLog, conv_key: ConversationKey
) -> None:
    assert log.read_newest(conv_key, None, 3) == []
    ids = log.append(conv_key, users("a", "b", "c", "d", "e"))
    log.truncate_after(conv_key, ids[3])  # a gap: the next id is not ids[4]
    ids = ids[:4] + log.append(conv_key, users("f"))
    newest = log.read_newest(conv_key, None, 3)
    assert [m.context_message_id for m in newest] == ids[-3:]
    assert [m.content for m in newest] == ["c", "d", "f"]
    assert [m.context_message_id for m in log.read_newest(conv_key, ids[2], 10)] == ids[3:]
    assert log.read_newest(conv_key, ids[-1], 10) == []
    assert log.read_newest(conv_key, None, 0) == []
    assert log.read_newest(conv_key, ids[0], 100) == log.read_after(conv_key, ids[0])
