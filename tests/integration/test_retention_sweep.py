"""The workers' retention sweep: it unlists Redis conversations whose keys expired (never
one appended again meanwhile) and deletes idle SQL conversations with their Redis leftovers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, RedisMessageLog
from ctxcore.state.redis.retention import tenant_activity_key, tenant_index_key
from ctxcore.state.retention import Retention
from tests.integration.test_retention_sql import DAY, Stores, stores
from workers.failures import FailureStore
from workers.retention import RetentionSweep

__all__ = ["stores"]  # the SQL fixture, shared


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.mark.redis
def test_the_sweep_unlists_expired_conversations(client: redis.Redis, redis_prefix: str) -> None:
    prefix, retention = redis_prefix, Retention(seconds=1.0)
    log = RedisMessageLog(client, prefix, retention)
    gone, kept = ConversationKey("t", "gone"), ConversationKey("t", "kept")
    log.append(gone, [UserMessage(content="hello")])
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        log.append(kept, [UserMessage(content="still here")])
        time.sleep(0.2)
    assert log.list_conversations("t") == ["gone", "kept"]
    report = RetentionSweep(client, prefix, retention).run()
    assert report.unlisted == 1
    assert log.list_conversations("t") == ["kept"]
    assert client.zscore(tenant_activity_key(prefix, "t"), "gone") is None
    assert client.zscore(tenant_index_key(prefix, "t"), "kept") is not None
    # A tenant without a retention is left alone.
    assert RetentionSweep(client, prefix, Retention(tenants={"other": 1.0})).run().unlisted == 0


@pytest.mark.redis
def test_a_conversation_appended_again_after_the_sweep_is_listed(
    client: redis.Redis, redis_prefix: str
) -> None:
    prefix, retention = redis_prefix, Retention(seconds=1.0)
    log = RedisMessageLog(client, prefix, retention)
    key = ConversationKey("t", "again")
    log.append(key, [UserMessage(content="one")])
    time.sleep(1.2)
    sweep = RetentionSweep(client, prefix, retention)
    # An append between the sweep's existence check and its unlisting keeps the listing.
    real_gone = sweep._gone

    def racing(tenant: str, ids: list[str]) -> list[str]:
        out = real_gone(tenant, ids)
        log.append(key, [UserMessage(content="two")])
        return out

    sweep._gone = racing  # type: ignore[method-assign]
    assert sweep.run().unlisted == 0
    assert log.list_conversations("t") == ["again"]
    assert log.read_after(key, None)[0].content == "two"


@pytest.mark.redis
def test_the_workers_sweep_deletes_sql_conversations_and_their_redis_leftovers(
    stores: Stores, redis_url: str, redis_prefix: str
) -> None:
    s = stores
    client = redis.Redis.from_url(redis_url)
    try:
        retention = Retention(tenants={s.tenant: 10 * DAY})
        failures = FailureStore(client, redis_prefix, retention=retention)
        key = s.key("c")
        s.fill(key)
        failures.record(key, "model_error", "boom", None)
        s.clock.now += 11 * DAY
        sweep = RetentionSweep(client, redis_prefix, retention, failures=failures, sql=s.sweep, clock=s.clock)
        assert sweep.run().deleted == 1
        assert s.rows(key) == 0
        assert not client.exists(failures.key(key))
    finally:
        client.close()
