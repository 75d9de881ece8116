"""Retention on Redis: every key of a conversation carries a TTL, short TTLs expire for real,
and windows refresh them rarely.

The SCAN test drives every write path a conversation has (appends, windows, a compaction
with its archive, offloads, the failure record, the scheduler's mirror, the proxy's index)
and fails on any key under the conversation's hash tag without a TTL.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from ctxcore.config import Settings
from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, RedisMessageLog, RedisOffloadStore, RedisStateStore
from ctxcore.state.redis.retention import RedisRetention, tenant_activity_key, tenant_index_key
from ctxcore.state.retention import Retention
from ctxcore.state.tail import AppendCounts
from ctxcore.tokens import EstimateCounter
from tests.chaos.helpers import agent_round
from workers.keyspace import delete_prefixed_keys
from workers.proxy.index import HashIndex
from workers.runtime import Runtime, build_service
from workers.service import InlineQueue

pytestmark = pytest.mark.redis

BUDGET = 2000


def _settings(url: str, prefix: str, nodes: list[str] | None = None, **service: Any) -> Settings:
    return Settings.load(
        {
            "redis": {"url": url, "key_prefix": prefix, "cluster_nodes": nodes or []},
            "service": service,
            "recall": {"enabled": True},
            "tenants": {"short": {"retention_days": 1}},
        }
    )


@pytest.fixture(params=["redis", pytest.param("redis_cluster", marks=pytest.mark.redis_cluster)])
def runtime(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Runtime]:
    """A runtime with a 30-day retention on Redis, then on a Redis Cluster (the listing and
    activity set in another slot than the conversation: separate calls there)."""
    nodes = request.getfixturevalue("redis_cluster_nodes") if request.param == "redis_cluster" else None
    prefix = f"ret{uuid.uuid4().hex[:10]}"
    rt = Runtime(_settings(redis_url, prefix, nodes, retention_days=30))
    yield rt
    delete_prefixed_keys(rt.redis, prefix)
    rt.redis.close()


def _conversation_keys(client: redis.Redis, prefix: str, key: ConversationKey) -> dict[str, int]:
    """Every key of this test's prefix under the conversation's hash tag, and its PTTL (other
    tests' conversations of the same id, in the same database, are not this test's)."""
    tag = key.hash_tag.replace("{", "\\{").replace("}", "\\}")
    names = sorted(n.decode() for n in client.scan_iter(match=f"{prefix}*{tag}*", count=1000))
    return {name: int(client.pttl(name)) for name in names}


def _assert_all_expire(client: redis.Redis, prefix: str, key: ConversationKey, after: str) -> dict[str, int]:
    found = _conversation_keys(client, prefix, key)
    without = [name for name, ttl in found.items() if ttl < 0]
    assert without == [], f"after {after}: keys without a TTL: {without}"
    return found


def test_every_key_of_a_conversation_expires(runtime: Runtime) -> None:
    # Checked after each write path: an append refreshes every key, hiding a path that
    # forgot its TTL, so the writes after the appends come one by one.
    rt, key, client = runtime, ConversationKey("acme", "c1"), runtime.redis
    prefix = rt.settings.redis.key_prefix
    service = build_service(rt, InlineQueue())
    rng = random.Random(7)
    for r in range(6):
        service.append(key, agent_round(rng, f"c1-{r}", steps=3))
        service.get_window(key, BUDGET + r)  # a new budget each time: the budget is rewritten
    _assert_all_expire(client, prefix, key, "appends and windows")
    stage = rt.coordinator.plan(key)
    assert stage is not None
    assert rt.coordinator.run_stage(key, stage).outcome == "compressed"
    assert rt.state_store.load_archive(key) is not None
    _assert_all_expire(client, prefix, key, "a compaction and its archive")
    service.get_window(key, BUDGET)
    service.get_window(key, BUDGET, model="gpt-4o")  # counts under another encoding
    _assert_all_expire(client, prefix, key, "windows over the compacted state")
    client.delete(f"{rt.settings.redis.key_prefix}:{key.hash_tag}:budget")
    rt.state_store.set_budget(key, 1234)  # the windows off the one-script read
    _assert_all_expire(client, prefix, key, "a budget set by set_budget")
    assert rt.offloads.put_if_absent(key, "0123456789abcdef", [UserMessage(content="x")])
    client.delete(f"{rt.settings.redis.key_prefix}:{key.hash_tag}:offload")
    assert isinstance(rt.offloads, RedisOffloadStore)
    rt.offloads.put_many_if_absent(key, [("fedcba9876543210", [UserMessage(content="y")])])
    _assert_all_expire(client, prefix, key, "offloads")
    rt.failures.record(key, "model_error", "boom", "l0_to_l1")
    _assert_all_expire(client, prefix, key, "a failure")
    rt.failures.job_finished(key, failed=True)
    client.delete(rt.failures.key(key))
    rt.scheduler.request(key)
    _assert_all_expire(client, prefix, key, "the scheduler's mirror")
    client.delete(rt.failures.key(key))
    rt.failures.version_saved(key)
    _assert_all_expire(client, prefix, key, "a saved version")
    rt.failures.job_finished(key, failed=False)
    _assert_all_expire(client, prefix, key, "a success")
    index = HashIndex(rt.redis, rt.settings.redis.key_prefix, rt.retention)
    entries = index.entries(key, rt.log)
    _assert_all_expire(client, prefix, key, "the proxy's index")
    index.delete(key)
    index.extend(key, None, entries[:1])
    _assert_all_expire(client, prefix, key, "extending the proxy's index")
    rt.log.truncate_after(key, entries[-2].log_id)
    found = _assert_all_expire(client, prefix, key, "a truncation")

    suffixes = {name.rsplit("}:", 1)[1] for name in found}
    assert {
        "log",
        "state:history",
        "archive",
        "archive:index",
        "offload",
        "compaction",
        "proxyidx",
    } <= suffixes
    assert {"log:other", "budget", "log:end", "state:head"} <= suffixes
    full = 30 * 86400 * 1000
    assert all(full - 60_000 < ttl <= full for ttl in found.values()), found


def test_refreshed_keys_share_the_conversation_slot() -> None:
    retention = RedisRetention(redis.Redis(), "p", Retention(seconds=60.0))
    key = ConversationKey("acme", "c1")
    names = [*retention.refreshed_keys(key), retention.name(key, "compaction")]
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert key_slot(tenant_index_key("p", "acme").encode()) == key_slot(
        tenant_activity_key("p", "acme").encode()
    )


def test_no_retention_sets_no_ttl(redis_url: str) -> None:
    prefix = f"ret{uuid.uuid4().hex[:10]}"
    rt = Runtime(Settings.load({"redis": {"url": redis_url, "key_prefix": prefix}}))
    try:
        key = ConversationKey("other", "c1")
        service = build_service(rt, InlineQueue())
        service.append(key, agent_round(random.Random(3), "n", steps=2))
        service.get_window(key, BUDGET)
        rt.failures.record(key, "model_error", "boom", None)
        found = _conversation_keys(rt.redis, prefix, key)
        assert found and all(ttl == -1 for ttl in found.values()), found
        assert not rt.redis.exists(tenant_activity_key(prefix, "other"))
    finally:
        delete_prefixed_keys(rt.redis, prefix)
        rt.redis.close()


def test_tenant_override_sets_its_own_ttl(runtime: Runtime) -> None:
    key = ConversationKey("short", "c1")
    build_service(runtime, InlineQueue()).append(key, [UserMessage(content="hi")])
    found = _conversation_keys(runtime.redis, runtime.settings.redis.key_prefix, key)
    assert found and all(86_340_000 < ttl <= 86_400_000 for ttl in found.values()), found


@pytest.fixture()
def stores(redis_url: str, redis_prefix: str) -> Iterator[tuple[redis.Redis, str, Retention]]:
    client = redis.Redis.from_url(redis_url)
    yield client, redis_prefix, Retention(seconds=1.0)
    client.close()


def test_short_retention_expires_for_real(
    stores: tuple[redis.Redis, str, Retention],
) -> None:
    client, prefix, retention = stores
    log, state = RedisMessageLog(client, prefix, retention), RedisStateStore(client, prefix, retention)
    offloads = RedisOffloadStore(client, prefix, retention=retention)
    gone, kept = ConversationKey("t", "gone"), ConversationKey("t", "kept")
    for key in (gone, kept):
        log.counted().append_counted(
            key, [UserMessage(content="hello")], AppendCounts("o200k_base", [3], [True])
        )
        assert state.save(key, state.load(key) or _empty(), 0)
        offloads.put_if_absent(key, "0123456789abcdef", [UserMessage(content="x")])
    assert log.list_conversations("t") == ["gone", "kept"]
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        # Appends keep one conversation alive; the other is left alone.
        log.append(kept, [UserMessage(content="still here")])
        time.sleep(0.2)
    assert _conversation_keys(client, prefix, gone) == {}
    assert log.last_id(gone) is None and state.load(gone) is None
    assert state.load(kept) is not None and log.last_id(kept) is not None
    # The listing is in another slot: it outlives the keys until the workers' sweep
    # (tests/integration/test_retention_sweep.py).
    assert log.list_conversations("t") == ["gone", "kept"]
    assert client.zscore(tenant_activity_key(prefix, "t"), "gone") is not None


def _empty() -> Any:
    from ctxcore.state.models import CompressionState

    return CompressionState()


def test_windows_refresh_expiry_rarely(stores: tuple[redis.Redis, str, Retention]) -> None:
    client, prefix, _ = stores
    retention = Retention(seconds=2.0)  # refreshes once less than half of it is left
    settings = Settings.load({"redis": {"key_prefix": prefix}})
    log, state = RedisMessageLog(client, prefix, retention), RedisStateStore(client, prefix, retention)
    from workers.service import ContextService

    service = ContextService(settings, state, log, None, InlineQueue())
    key = ConversationKey("t", "w")
    service.append(key, [UserMessage(content="hello there")])
    writes: list[str] = []
    original = service._window_reader.refresh  # type: ignore[union-attr]

    def counting(k: ConversationKey) -> None:
        writes.append(str(k))
        original(k)

    service._window_reader.refresh = counting  # type: ignore[union-attr,method-assign]
    for _ in range(5):
        service.get_window(key, 1000)  # well within the retention: no refresh
    assert writes == []
    time.sleep(1.2)
    service.get_window(key, 1000)  # under half left: one refresh
    assert writes == ["t/w"]
    assert int(client.pttl(f"{prefix}:{key.hash_tag}:log")) > 1500
    time.sleep(1.2)
    # Windows alone keep it alive past the first append's expiry.
    assert service.get_window(key, 1000).messages
    assert log.last_id(key) is not None


def test_windows_off_the_script_refresh_too(stores: tuple[redis.Redis, str, Retention]) -> None:
    # A custom counter reads the stores one by one: set_budget keeps the TTL and the window
    # refreshes the conversation when due (one PTTL more).
    client, prefix, _ = stores
    retention = Retention(seconds=2.0)
    settings = Settings.load({"redis": {"key_prefix": prefix}})
    log, state = RedisMessageLog(client, prefix, retention), RedisStateStore(client, prefix, retention)
    from workers.service import ContextService

    service = ContextService(settings, state, log, None, InlineQueue(), counter=EstimateCounter())
    key = ConversationKey("t", "e")
    service.append(key, [UserMessage(content="hello there")])
    time.sleep(1.2)
    service.get_window(key, 1000)
    assert int(client.pttl(f"{prefix}:{key.hash_tag}:log")) > 1500
    assert 1500 < int(client.pttl(f"{prefix}:{key.hash_tag}:budget")) <= 2000
