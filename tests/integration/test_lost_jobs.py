"""A running job that lost its stage (no heartbeat, no pending stage for 2 x
``worker.heartbeat_seconds``) is queued again by the reconciler, shows ``failing`` with
``lost_task`` until it runs again, and is counted; a job that shows life is left alone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from ctxcore.state import ConversationKey
from workers.app import app, configure, queue_names, runtime
from workers.broker_queues import queue_ready
from workers.heartbeat import beat_until_due, heartbeat, heartbeat_interval
from workers.keyspace import delete_prefixed_keys
from workers.lost_jobs import requeue_lost_jobs
from workers.prom_worker import stage_metrics
from workers.runtime import Runtime
from workers.tasks import CeleryQueue

pytestmark = pytest.mark.redis

HEARTBEAT = 0.2  # a job may go 0.4 s without news


@pytest.fixture
def rt(redis_url: str) -> Iterator[Runtime]:
    prefix = f"ctxcore-test-{uuid.uuid4().hex}"
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "worker": {"heartbeat_seconds": HEARTBEAT, "scheduler_rings": 2},
        }
    )
    configure(settings)
    try:
        yield runtime()
    finally:
        delete_prefixed_keys(runtime().redis, prefix)
        configure(Settings())


def running_job(rt: Runtime, conversation: str = "c1") -> ConversationKey:
    key = ConversationKey("acme", conversation)
    assert rt.scheduler.request(key).created
    job = rt.scheduler.next_job(rt.scheduler.ring_of("acme"))
    assert job is not None and job.key == key
    rt.failures.job_started(key)
    return key


def drain_tokens(rt: Runtime) -> int:
    return queue_ready(queue_names(rt.settings).jobs, amqp=False)


def test_a_job_without_heartbeat_nor_pending_stage_is_queued_again_and_shows_lost_task(rt: Runtime) -> None:
    key = running_job(rt)
    tokens = drain_tokens(rt)
    before = stage_metrics().value("ctxcore_jobs_requeued_total")
    assert requeue_lost_jobs(rt) == 0  # it just started: alive for 2 x heartbeat
    time.sleep(2 * HEARTBEAT + 0.1)

    assert requeue_lost_jobs(rt) == 1
    assert rt.scheduler.status(key) == "queued"
    assert CeleryQueue().status(key) == "failing"
    error = rt.failures.detail(key).last_error
    assert error is not None and error.kind == "lost_task" and error.stage is None
    assert "no heartbeat and no pending stage for 0.4 s" in error.message
    assert stage_metrics().value("ctxcore_jobs_requeued_total") == before + 1
    assert drain_tokens(rt) == tokens + 1  # a drain token for its ring was sent
    assert not rt.failures.get(key).backing_off()  # not a failure of the job: no backoff
    assert requeue_lost_jobs(rt) == 0  # once

    # The job runs again: lost_task ends there.
    job = rt.scheduler.next_job(rt.scheduler.ring_of("acme"))
    assert job is not None and job.key == key
    rt.failures.job_started(key)
    assert rt.failures.detail(key).last_error is None
    assert CeleryQueue().status(key) == "running"


def test_a_running_stage_heartbeats_past_the_liveness_window(rt: Runtime) -> None:
    key = running_job(rt)
    with heartbeat(rt.scheduler, key, HEARTBEAT):
        time.sleep(5 * HEARTBEAT)  # a long stage
        assert requeue_lost_jobs(rt) == 0
    assert rt.scheduler.status(key) == "running"


def test_a_stage_waiting_for_its_retry_countdown_is_a_pending_task(rt: Runtime) -> None:
    key = running_job(rt)
    beat_until_due(rt.scheduler, key, due_in=1.0)  # the retry is due in 1 s
    time.sleep(2 * HEARTBEAT + 0.1)
    assert requeue_lost_jobs(rt) == 0
    time.sleep(1.0)
    assert requeue_lost_jobs(rt) == 1  # the retry never came: lost


def test_a_stage_waiting_in_the_stages_queue_holds_the_pass_back(rt: Runtime) -> None:
    key = running_job(rt)
    time.sleep(2 * HEARTBEAT + 0.1)
    stages = queue_names(rt.settings).stages
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(stages)
        queue.put({"a stage": "of a backlog"})
        try:
            assert requeue_lost_jobs(rt) == 0
            assert rt.scheduler.status(key) == "running"
        finally:
            queue.get(timeout=5).ack()
            queue.close()
    assert requeue_lost_jobs(rt) == 1


def test_a_finished_job_leaves_no_beat_behind(rt: Runtime) -> None:
    key = running_job(rt)
    assert rt.scheduler.finish(key) == 0
    assert not rt.scheduler.beat(key)  # not running: nothing written
    time.sleep(2 * HEARTBEAT + 0.1)
    assert requeue_lost_jobs(rt) == 0
    assert rt.scheduler.status(key) == "idle"


@pytest.mark.parametrize("heartbeat_seconds", [151, 1e9])
def test_a_heartbeat_longer_than_the_hard_time_limit_is_refused(heartbeat_seconds: float) -> None:
    with pytest.raises(
        ConfigError,
        match=r"worker.heartbeat_seconds \(\S+ s\) must not be longer than worker.hard_time_limit \(150 s\)",
    ):
        Settings.load({"worker": {"heartbeat_seconds": heartbeat_seconds}})


def test_the_default_heartbeat_fits_a_short_hard_time_limit() -> None:
    assert heartbeat_interval(Settings().worker) == 10.0
    short = Settings.load({"worker": {"soft_time_limit": 2.5, "hard_time_limit": 3.0}})
    assert heartbeat_interval(short.worker) == 1.5
