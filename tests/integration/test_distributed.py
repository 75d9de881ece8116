"""The distributed service end to end: real Redis, a real Celery worker (no eager mode).

The scheduler and lock tests run twice, on the plain Redis and on the session's
three-master Redis Cluster (``sched_redis``); the end-to-end test runs on the cluster from
tests/integration/test_cluster.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.state import ConversationKey
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window
from tests.datasets import conversations
from tests.workers_fixture import in_process_worker
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime, build_service
from workers.scheduler import FairScheduler

pytestmark = pytest.mark.redis


@pytest.fixture()
def settings(redis_url: str) -> Iterator[Settings]:
    """Settings with a key prefix of this test's own: ctxcore's keys and, through Celery's
    ``global_keyprefix``, its queues and results too. Exactly those keys are deleted after."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    yield Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "worker": {"retry_delays": [0.1, 0.2, 0.4], "lock_timeout": 10},
            "engine": {"keep_recent_messages": 4},
        }
    )
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


@pytest.fixture()
def worker(settings: Settings) -> Iterator[Runtime]:
    with in_process_worker(settings) as rt:
        yield rt


@pytest.fixture(params=["redis", pytest.param("redis_cluster", marks=pytest.mark.redis_cluster)])
def sched_redis(request: pytest.FixtureRequest) -> Iterator[tuple[redis.Redis, str]]:
    """A client and a key prefix of this test's own: the plain Redis, then the Redis Cluster
    (a ``RedisCluster`` as the runtime builds it). Its keys are deleted afterwards."""
    if request.param == "redis_cluster":
        yield request.getfixturevalue("cluster_redis")
        return
    settings: Settings = request.getfixturevalue("settings")
    client = redis.Redis.from_url(settings.redis.url)
    yield client, settings.redis.key_prefix
    client.close()


def _wait_idle(rt: Runtime, key: ConversationKey, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if rt.scheduler.status(key) == "idle":
            return
        time.sleep(0.1)
    raise AssertionError(f"compaction of {key} did not finish in {timeout}s")


def test_end_to_end_swe_run_turn_by_turn(worker: Runtime) -> None:
    from workers.tasks import CeleryQueue

    rt = worker
    service = build_service(rt, CeleryQueue())
    conv = max(conversations("minisweagent.jsonl"), key=lambda c: len(c["messages"]))
    msgs = from_openai(conv["messages"])
    system = [m for m in msgs if isinstance(m, SystemMessage)]
    rest: list[AnyMessage] = [m for m in msgs if not isinstance(m, SystemMessage)]
    key = ConversationKey("acme", f"swe-{uuid.uuid4().hex[:6]}")
    budget = 12_000
    counter = TiktokenCounter()
    appended: list[AnyMessage] = []
    i = 0
    windows = 0
    while i < len(rest):
        # One step at a time: an assistant message with its tool results.
        j = i + 1
        while j < len(rest) and rest[j].role == "tool":
            j += 1
        batch = rest[i:j]
        service.append(key, batch)
        appended.extend(batch)
        i = j
        result = service.get_window(key, budget, system)
        windows += 1
        assert counter.count_messages(result.messages) <= budget
        assert check_window(result.messages) == []
        served = {m.context_message_id for m in result.messages}
        logged = rt.log.read_after(key, None)
        for a in anchors(logged).indices():
            assert logged[a].context_message_id in served
    _wait_idle(rt, key)
    state = rt.state_store.load(key)
    assert state is not None and state.version >= 1 and state.blocks
    assert all(b.first_id <= b.last_id and b.tokens_before > 0 for b in state.blocks)
    assert any(b.level >= 1 for b in state.blocks)
    history = rt.state_store.history(key, 20)
    assert not any(b.block_id.startswith("T") for s in history for b in s.blocks), [
        (s.version, [b.block_id for b in s.blocks]) for s in history
    ]
    # The log is exactly what was appended.
    logged = rt.log.read_after(key, None)
    assert [m.model_copy(update={"context_message_id": None}) for m in logged] == appended
    final = service.get_window(key, budget, system)
    assert not final.fallback_applied


def test_fifty_concurrent_requests_make_one_job(sched_redis: tuple[redis.Redis, str]) -> None:
    client, prefix = sched_redis
    sched = FairScheduler(client, prefix=prefix)
    key = ConversationKey("acme", "busy")
    barrier = threading.Barrier(50)
    created: list[bool] = []

    def ask() -> None:
        barrier.wait()
        created.append(bool(sched.request(key)))

    threads = [threading.Thread(target=ask) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert created.count(True) == 1
    job = sched.next_job()
    assert job is not None and job.key == key and sched.next_job() is None
    # Requests while running coalesce into exactly one follow-up.
    assert [bool(sched.request(key)) for _ in range(10)] == [False] * 10
    assert sched.status(key) == "running"
    assert sched.finish(key) == 1  # finished, follow-up queued
    assert sched.status(key) == "queued"
    assert sched.next_job() is not None and sched.finish(key) == 0 and sched.status(key) == "idle"
    assert sched.finish(key) == -1  # nothing running: nothing to finish


def test_fairness_by_order_not_time(sched_redis: tuple[redis.Redis, str]) -> None:
    """Drain tokens are consumed in send order (one FIFO, like Celery's jobs queue): the
    quiet tenant's job starts within the first two drains per worker, whichever rings the
    two tenants hash to. (A token of no ring starts anywhere, at random: no order then.)"""
    client, prefix = sched_redis
    sched = FairScheduler(client, prefix=prefix)
    tokens: deque[int] = deque()
    for key in [
        *(ConversationKey("tenant-a", f"c{n}") for n in range(200)),
        ConversationKey("tenant-b", "only"),
    ]:
        requested = sched.request(key)
        assert requested
        if requested.token is not None:
            tokens.append(requested.token)
    workers = 2
    tenants: list[str] = []
    for _ in range(workers * 2):
        job = sched.next_job(tokens.popleft())
        assert job is not None
        tenants.append(job.key.tenant_id)
        if job.resend:
            tokens.append(job.ring)
    assert "tenant-b" in tenants, tenants
    assert sched.depth() == 201 - workers * 2


def test_lease_expiry_requeues_after_a_dead_worker(sched_redis: tuple[redis.Redis, str]) -> None:
    client, prefix = sched_redis
    sched = FairScheduler(client, prefix=prefix, lease_seconds=0.2)
    key = ConversationKey("acme", "crashy")
    assert sched.request(key)
    assert sched.next_job() is not None  # taken by a worker that then dies
    assert not sched.request(key)  # still leased
    time.sleep(0.3)
    assert sched.status(key) == "idle"
    assert sched.request(key)


def test_two_stage_runs_of_one_conversation_never_overlap(sched_redis: tuple[redis.Redis, str]) -> None:
    from workers.locks import LockBusy, conversation_lock

    client, prefix = sched_redis
    key = ConversationKey("acme", "locked")
    inside = threading.Event()
    release = threading.Event()
    busy: list[bool] = []

    def holder() -> None:
        with conversation_lock(client, prefix, key, timeout=0.6):
            inside.set()
            release.wait(2)

    t = threading.Thread(target=holder)
    t.start()
    inside.wait(2)
    time.sleep(0.5)  # past the original timeout: the keep-alive must have extended it
    try:
        with conversation_lock(client, prefix, key):
            busy.append(False)
    except LockBusy:
        busy.append(True)
    release.set()
    t.join()
    assert busy == [True]
    with conversation_lock(client, prefix, key):
        pass


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout}s")


def test_last_success_at_only_after_a_job_saved_a_version(worker: Runtime) -> None:
    from workers.tasks import CeleryQueue, request_compaction

    rt = worker
    service = build_service(rt, CeleryQueue())
    key = ConversationKey("acme", f"quiet-{uuid.uuid4().hex[:6]}")
    service.append(
        key, from_openai([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    )
    assert request_compaction(key, "manual") == "queued"
    # The job runs and finds nothing to do: no version saved, so no success stamped.
    _wait_for(lambda: rt.scheduler.status(key) == "idle", 30, "the job's end")
    time.sleep(0.5)  # the job's record is closed just after the scheduler's
    detail = rt.failures.detail(key)
    assert rt.state_store.load(key) is None
    assert detail.last_error is None and detail.last_success_at is None

    conv = max(conversations("minisweagent.jsonl"), key=lambda c: len(c["messages"]))
    msgs = [m for m in from_openai(conv["messages"]) if not isinstance(m, SystemMessage)]
    service.append(key, msgs)
    service.get_window(key, 6000)  # over the trigger: a job that saves versions
    _wait_for(lambda: rt.failures.detail(key).last_success_at is not None, 60, "last_success_at")
    state = rt.state_store.load(key)
    assert state is not None and state.version >= 1
