"""The slot check: every Lua script call's keys hash to one cluster slot.

Each script-running component works through its operations on a plain Redis while every
``Script`` call is recorded; a call whose ``KEYS`` span two slots would be a CROSSSLOT error
on a cluster (and a key built inside a script, not passed in ``KEYS``, could not be routed:
the scheduler's scripts take every key they touch).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.commands.core import Script
from redis.crc import key_slot

from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, RedisMessageLog, RedisOffloadStore, RedisStateStore
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite
from ctxcore.state.models import CompressionState
from ctxcore.state.redis.retention import RedisRetention
from ctxcore.state.redis.window import RedisWindowReader
from ctxcore.state.retention import Retention
from ctxcore.state.tail import AppendCounts
from workers import scheduler_scripts
from workers.circuit import CircuitBreaker
from workers.failures import FailureStore
from workers.locks import conversation_lock
from workers.ratelimit import RateLimiter
from workers.scheduler import FairScheduler

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("retention", [None, Retention(seconds=60.0)], ids=["plain", "retention"])
def test_every_script_call_stays_in_one_slot(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, retention: Retention | None
) -> None:
    calls: list[tuple[str, list[str]]] = []
    original = Script.__call__

    def recording(self: Script, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        calls.append(
            (self.script if isinstance(self.script, str) else self.script.decode(), list(keys or []))
        )
        return original(self, keys=keys, args=args, client=client)

    monkeypatch.setattr(Script, "__call__", recording)
    client = redis.Redis.from_url(redis_url)
    key = ConversationKey("acme", "c1")
    p = redis_prefix

    state, log, offloads = (
        RedisStateStore(client, p, retention),
        RedisMessageLog(client, p, retention),
        RedisOffloadStore(client, p, retention=retention),
    )
    log.append(key, [UserMessage(content="a"), UserMessage(content="b")])
    log.counted().append_counted(key, [UserMessage(content="c")], AppendCounts("o200k_base", [5], [True]))
    log.counted().read_tail(key, None, budget_tokens=100, encoding="o200k_base")
    RedisWindowReader(client, p, RedisRetention(client, p, retention)).read(key, 100, "o200k_base")
    log.truncate_after(key, "000000000001")
    assert state.save(key, CompressionState(), 0)
    chunk = ArchiveChunk("000000000001", "000000000001", "a", 1)
    assert state.save(key, CompressionState(), 1, archive=ArchiveWrite((chunk,), b"index", 2))
    offloads.put_if_absent(key, "0123456789abcdef", [UserMessage(content="x")])

    failures = FailureStore(client, p, retention=retention)
    sched = FairScheduler(
        client,
        p,
        lease_seconds=60,
        requeue_after_seconds=0.0,
        mirror=failures.key,
        retention=RedisRetention(client, p, retention),
    )
    for tenant in ("t1", "t2", "t3"):
        sched.request(ConversationKey(tenant, "c1"))
    job = sched.next_job(sched.ring_of("t1"))
    assert job is not None
    sched.request(job.key)  # dirty
    sched.renew(job.key)
    sched.beat(job.key, -1.0)  # a deadline already passed: lost
    assert [lost.key for lost in sched.requeue_lost()] == [job.key]
    again = sched.next_job(sched.ring_of("t1"))
    assert again is not None and again.key == job.key
    sched.finish(job.key)
    sched.stuck_rings()
    sched.forget(ConversationKey("t2", "c1"))

    RateLimiter(client, p).take("t1", rate=1.0, burst=1)
    breaker = CircuitBreaker(client, p, failure_threshold=1)
    breaker.allow("t1", "http://x/v1")
    breaker.record_failure("t1", "http://x/v1")
    breaker.record_success("t1", "http://x/v1")
    with conversation_lock(client, p, key, timeout=5):
        pass
    client.close()

    spans = [
        (script.splitlines()[1][:60], keys)
        for script, keys in calls
        if len({key_slot(k.encode()) for k in keys}) > 1
    ]
    assert spans == []
    ran = {script for script, _ in calls}
    for name in scheduler_scripts.__all__:
        assert getattr(scheduler_scripts, name) in ran, f"scheduler script {name} not exercised"
    assert len(calls) > 20
