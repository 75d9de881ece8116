"""The stage journal stores (``ctxcore.state.journal``) on every backend: newest first,
bounded, per conversation, deleted with it and kept under its retention."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
import redis

from ctxcore.errors import StoreError
from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, RedisMessageLog, SqlMessageLog, SqlStateStore
from ctxcore.state.journal import JOURNAL_LIMIT, JournalEntry, MemoryStageJournal
from ctxcore.state.redis.journal import RedisStageJournal
from ctxcore.state.retention import Retention
from ctxcore.state.sql.journal import SqlStageJournal
from ctxcore.state.sql.retention import SqlRetentionSweep
from tests.conftest import Backend


def _entry(n: int, outcome: str = "compressed") -> JournalEntry:
    return JournalEntry(
        stage="l0_to_l1",
        outcome=outcome,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        tokens_before=1000 + n,
        tokens_after=500,
        model_calls=1,
        input_tokens=900,
        output_tokens=120,
        duration_ms=12.5,
        version=n,
        detail=f"run {n}",
    )


def test_entries_are_newest_first_bounded_and_per_conversation(
    backend: Backend, conv_key: ConversationKey
) -> None:
    journal = backend.journal(limit=5)
    other = ConversationKey(conv_key.tenant_id, "conv-2")
    for n in range(1, 8):
        journal.append(conv_key, _entry(n))
    journal.append(other, _entry(99, "skipped"))

    got = journal.entries(conv_key)
    assert [e.version for e in got] == [7, 6, 5, 4, 3]  # the newest 5, newest first
    assert got[0] == _entry(7)  # every field round-trips
    assert [e.version for e in journal.entries(conv_key, limit=2)] == [7, 6]
    assert journal.entries(conv_key, limit=0) == []
    assert [e.outcome for e in journal.entries(other)] == ["skipped"]
    assert journal.entries(ConversationKey("another-tenant", conv_key.conversation_id)) == []

    journal.delete(conv_key)
    assert journal.entries(conv_key) == []
    assert len(journal.entries(other)) == 1


def test_the_default_bound_is_200(backend: Backend, conv_key: ConversationKey) -> None:
    journal = backend.journal()
    for n in range(JOURNAL_LIMIT + 5):
        journal.append(conv_key, _entry(n))
    got = journal.entries(conv_key, limit=1000)
    assert len(got) == JOURNAL_LIMIT == 200
    assert got[0].version == JOURNAL_LIMIT + 4 and got[-1].version == 5


def test_a_corrupt_entry_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="journal entry"):
        JournalEntry.from_json(b'{"stage": "x"}')
    assert MemoryStageJournal().entries(ConversationKey("t", "c")) == []


@pytest.mark.redis
def test_redis_journal_takes_the_conversation_expiry(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        retention = Retention.from_days(1.0)
        key = ConversationKey("tenant-ret", "conv-ret")
        log = RedisMessageLog(client, redis_prefix, retention=retention)
        log.append(key, [UserMessage(content="hello")])
        journal = RedisStageJournal(client, redis_prefix, retention=retention)
        journal.append(key, _entry(1))
        name = f"{redis_prefix}:{key.hash_tag}:journal"
        ttl = client.pttl(name)
        assert 0 < ttl <= 86_400_000
        assert abs(ttl - client.pttl(f"{redis_prefix}:{key.hash_tag}:log:seq")) < 5_000
        # Without a retention the journal lives as long as the conversation's other keys: no TTL.
        plain = RedisStageJournal(client, redis_prefix)
        other = ConversationKey("tenant-ret", "conv-plain")
        plain.append(other, _entry(1))
        assert client.pttl(f"{redis_prefix}:{other.hash_tag}:journal") == -1
    finally:
        client.close()


def test_sql_retention_sweep_deletes_the_journal(tmp_path: pytest.TempPathFactory) -> None:
    url = f"sqlite:///{tmp_path}/j.db"
    clock = [time.time() - 10 * 86_400]
    store = SqlStateStore(url)
    store.setup()
    try:
        log = SqlMessageLog(engine=store.engine, clock=lambda: clock[0])
        journal = SqlStageJournal(engine=store.engine)
        key = ConversationKey("tenant-s", "conv-s")
        log.append(key, [UserMessage(content="old")])
        journal.append(key, _entry(1))
        sweep = SqlRetentionSweep(engine=store.engine)
        assert sweep.delete_if_idle(key, time.time() - 86_400)
        assert journal.entries(key) == []
    finally:
        store.close()
