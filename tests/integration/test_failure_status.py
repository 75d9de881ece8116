"""Failure records, backoff, token liveness and deployment isolation, on a real Redis.

The pieces the worker tests exercise end to end, one at a time: the failure hash and its
backoff (doubling, capped, reset by a success), the status and detail the API shows, the
scheduler's token scores (a stuck job is taken by one reconciler per interval; a request
re-sends a stale token; a failed job drops its follow-up), and the Celery configuration
that keeps two deployments on one Redis apart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.state import ConversationKey
from workers.failures import FailureStore, StageFailedError, classify_failure, public_endpoint
from workers.keyspace import delete_prefixed_keys
from workers.redis_clients import is_cluster
from workers.runtime import Runtime
from workers.scheduler import FairScheduler

pytestmark = pytest.mark.redis
TEST_DB = 12
TOKEN = "failure-status-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEY = ConversationKey("tenant-s", "conv-1")


@pytest.fixture()
def settings(redis_url: str) -> Iterator[Settings]:
    """Settings on a test database under a unique prefix; every key of it is deleted after."""
    url = f"{redis_url.rsplit('/', 1)[0]}/{TEST_DB}"
    prefix = f"fs{uuid.uuid4().hex[:8]}"
    yield Settings.load(
        {
            "redis": {"url": url, "key_prefix": prefix},
            "http": {"tokens": {hash_token(TOKEN): KEY.tenant_id}},
            "worker": {
                "failure_backoff_seconds": 0.3,
                "failure_backoff_max_seconds": 1.0,
                "requeue_after_seconds": 0.5,
            },
        }
    )
    client = redis.Redis.from_url(url)
    try:
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


def test_failure_record_backoff_doubles_is_capped_and_a_success_resets_it(settings: Settings) -> None:
    rt = Runtime(settings)
    store: FailureStore = rt.failures
    assert store.detail(KEY).last_error is None and not store.get(KEY).failing
    pauses = []
    for n in range(4):
        store.job_started(KEY)
        assert not store.run_failed(KEY)
        error = store.record(KEY, "rate_limit", f"429 number {n}", "l0_to_l1")
        assert store.run_failed(KEY)
        pauses.append(store.job_finished(KEY, failed=True))
        assert not store.run_failed(KEY)
        assert store.detail(KEY).last_error == error
    assert pauses == [0.3, 0.6, 1.0, 1.0]
    record = store.get(KEY)
    assert record.failing and record.backing_off() and not record.backing_off(now=record.retry_at + 0.01)
    assert rt.redis.exists(
        f"{settings.redis.key_prefix}:{KEY.hash_tag}:compaction"
    )  # the conversation's slot
    # A job without a failed stage clears the error and the backoff; with nothing to do it
    # saved no version, so it is no success: last_success_at stays unset.
    store.job_started(KEY)
    assert store.job_finished(KEY, failed=False) is None
    detail = store.detail(KEY)
    assert detail.last_error is None and detail.last_success_at is None
    assert not store.get(KEY).backing_off() and not store.get(KEY).failing
    # A job one of whose stages saved a version is a success.
    store.job_started(KEY)
    store.version_saved(KEY)
    assert store.job_finished(KEY, failed=False) is None
    success = store.detail(KEY).last_success_at
    assert success is not None
    # The next job saves nothing: the stamp stays the last saving job's.
    store.job_started(KEY)
    store.job_finished(KEY, failed=False)
    assert store.detail(KEY).last_success_at == success
    # A job that saved a version and then failed is no success either.
    store.job_started(KEY)
    store.version_saved(KEY)
    store.record(KEY, "timeout", "slow", "recursive_merge")
    assert store.job_finished(KEY, failed=True) == 0.3  # the count started over
    assert store.detail(KEY).last_success_at == success
    store.delete(KEY)
    assert store.get(KEY).detail.last_success_at is None


def test_failures_are_classified_and_endpoints_logged_without_credentials() -> None:
    assert classify_failure(StageFailedError("timeout", "Request timed out.")) == (
        "timeout",
        "Request timed out.",
    )
    assert classify_failure(TypeError("bad operand")) == ("internal", "TypeError: bad operand")
    from ctxcore.errors import StoreUnavailable

    assert classify_failure(StoreUnavailable("Redis down"))[0] == "store_unavailable"
    error = StageFailedError("rate_limit", "429")
    assert str(error) == "rate_limit: 429" and StageFailedError(*error.args).kind == "rate_limit"
    assert public_endpoint("https://user:sk-secret@api.example.com:8443/v1?key=sk-2") == (
        "https://api.example.com:8443/v1"
    )
    assert public_endpoint(None) == "offline ExtractiveModel"


def test_the_api_shows_failing_and_holds_requests_back_until_the_backoff_passes(settings: Settings) -> None:
    from workers.app import configure, queue_names
    from workers.http import create_app
    from workers.tasks import CeleryQueue

    configure(settings)
    try:
        rt = Runtime(settings)
        client = TestClient(create_app(rt, CeleryQueue()))
        conv = f"/v1/conversations/{KEY.conversation_id}"
        body = [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "more " * 400}]
        assert client.post(f"{conv}/messages", json={"messages": body}, headers=AUTH).status_code == 201
        ok = client.post(f"{conv}/window", json={"budget_tokens": 100_000}, headers=AUTH).json()
        assert ok["compaction"] == "idle" and ok["compaction_detail"] == {
            "last_error": None,
            "last_success_at": None,
            "reason": None,
            "hold": None,
        }

        rt.failures.job_started(KEY)
        rt.failures.record(KEY, "authentication", "Error code: 401 - Incorrect API key", "l0_to_l1")
        rt.failures.job_finished(KEY, failed=True)  # backoff 0.3 s
        window = client.post(
            f"{conv}/window", json={"budget_tokens": 500}, headers=AUTH
        ).json()  # over trigger
        assert window["compaction"] == "failing"
        error = window["compaction_detail"]["last_error"]
        assert (
            error["kind"] == "authentication" and "401" in error["message"] and error["stage"] == "l0_to_l1"
        )
        assert error["at"].endswith(("Z", "+00:00"))  # UTC
        compact = client.post(f"{conv}/compact", headers=AUTH)
        assert compact.status_code == 202 and compact.json() == {"status": "failing"}
        assert rt.scheduler.status(KEY) == "idle"  # held back: nothing queued
        state = client.get(f"{conv}/state", headers=AUTH).json()
        assert state["compaction_detail"]["last_error"]["kind"] == "authentication"

        time.sleep(0.35)
        assert client.post(f"{conv}/compact", headers=AUTH).json() == {"status": "failing"}
        assert rt.scheduler.status(KEY) == "queued"  # past the backoff: queued, a token sent
        jobs = f"{settings.redis.key_prefix}:{queue_names(settings).jobs}"
        assert rt.redis.llen(jobs) == 1

        # The job then succeeds: the error is gone, the scheduler's status shows again.
        assert rt.scheduler.next_job() is not None
        rt.failures.job_started(KEY)
        rt.failures.version_saved(KEY)
        rt.failures.job_finished(KEY, failed=False)
        window = client.post(f"{conv}/window", json={"budget_tokens": 100_000}, headers=AUTH).json()
        assert window["compaction"] == "running" and window["compaction_detail"]["last_error"] is None
        assert window["compaction_detail"]["last_success_at"] is not None

        assert client.delete(conv, headers=AUTH).status_code == 204
        assert not rt.redis.exists(rt.failures.key(KEY))
    finally:
        configure(Settings())


@pytest.fixture(params=["redis", pytest.param("redis_cluster", marks=pytest.mark.redis_cluster)])
def ring_runtime(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Runtime]:
    """A runtime on the plain Redis, then one whose ctxcore keys are on the session's Redis
    Cluster (its keys there deleted afterwards)."""
    if request.param == "redis":
        rt = Runtime(settings)
    else:
        nodes = request.getfixturevalue("redis_cluster_nodes")
        on_cluster = settings.redis.model_copy(update={"cluster_nodes": tuple(nodes)})
        rt = Runtime(settings.model_copy(update={"redis": on_cluster}))
        assert is_cluster(rt.redis)
    yield rt
    if request.param != "redis":
        delete_prefixed_keys(rt.redis, settings.redis.key_prefix)
    rt.redis.close()


def test_a_stuck_ring_is_taken_by_one_reconciler_and_a_request_resends_a_stale_token(
    ring_runtime: Runtime,
) -> None:
    rt = ring_runtime
    sched: FairScheduler = rt.scheduler
    ring = sched.ring_of(KEY.tenant_id)
    assert sched.request(KEY).token == ring  # new job: send a token of its ring
    assert not sched.request(KEY)  # queued, the ring's token is fresh
    assert sched.stuck_rings() == {}
    time.sleep(0.55)  # past requeue_after_seconds without the job starting: the token was lost
    taken = [sched.stuck_rings(), sched.stuck_rings()]  # two reconcilers in one interval
    assert taken == [{ring: 1}, {}]
    assert not sched.request(KEY)  # just re-stamped
    time.sleep(0.55)
    assert sched.request(KEY).token == ring  # a request on a job waiting too long sends a token itself
    assert sched.stuck_rings() == {}
    assert sched.next_job(ring) is not None
    time.sleep(0.55)
    assert sched.stuck_rings() == {}  # started jobs are not stuck
    # A request while running marks it dirty; a failed run drops that follow-up.
    assert not sched.request(KEY) and sched.status(KEY) == "running"
    assert sched.finish(KEY, follow_up=False) == 0 and sched.status(KEY) == "idle"
    assert sched.request(KEY).created
    sched.forget(KEY)
    time.sleep(0.55)
    assert sched.stuck_rings() == {} and sched.status(KEY) == "idle"


def test_a_ring_whose_token_died_is_revived_while_a_busy_rings_tokens_wait_in_the_queue(
    ring_runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed holding ring B's only token; ring A's two tokens sit in the jobs queue
    (a busy tenant, workers saturated). A's tokens start A's jobs, never B's: the reconciler
    must still send B one, and only one."""
    from workers import reconciler

    sched: FairScheduler = ring_runtime.scheduler
    busy = next(f"busy-{i}" for i in range(100) if sched.ring_of(f"busy-{i}") != sched.ring_of("quiet"))
    ring_a, ring_b = sched.ring_of(busy), sched.ring_of("quiet")
    for n in range(3):
        sched.request(ConversationKey(busy, f"c{n}"))  # two tokens out for ring A, capped
    assert sched.request(ConversationKey("quiet", "c0")).token == ring_b  # that token is lost
    time.sleep(0.55)  # past requeue_after_seconds
    job = sched.next_job(ring_a)  # ring A's tokens flow: one consumed and re-sent
    assert job is not None and job.resend and job.key.tenant_id == busy
    sent: list[tuple[int, int | None]] = []
    monkeypatch.setattr(reconciler, "_waiting_tokens", lambda _settings: 2)  # A's two, queued
    monkeypatch.setattr(
        reconciler, "send_drain_tokens", lambda count=1, ring=None: sent.append((count, ring)) or count
    )
    # Over this test's runtime, not the app's: an in-process worker left by another test
    # would run its reconciler timer over whatever runtime the app was configured with.
    assert reconciler.reconcile(ring_runtime) == 1
    assert sent == [(1, ring_b)]
    assert reconciler.reconcile(ring_runtime) == 0  # revived once per interval
    job = sched.next_job(ring_b)  # the token sent starts the quiet tenant's job
    assert job is not None and job.key == ConversationKey("quiet", "c0")


def test_celery_config_isolates_deployments(settings: Settings) -> None:
    from workers.app import app, celery_config, configure, queue_names

    prefix = settings.redis.key_prefix
    conf: dict[str, Any] = celery_config(settings)
    assert conf["broker_transport_options"]["global_keyprefix"] == f"{prefix}:"
    assert conf["result_backend_transport_options"] == {"global_keyprefix": f"{prefix}:"}
    assert queue_names(settings) == (f"{prefix}.jobs", f"{prefix}.stages")
    assert conf["task_default_queue"] == f"{prefix}.jobs"
    assert conf["task_routes"] == {"ctxcore.stage.*": {"queue": f"{prefix}.stages"}}
    assert (conf["control_exchange"], conf["event_exchange"]) == (f"{prefix}.control", f"{prefix}.events")
    try:
        configure(Settings())
        assert app.control.mailbox.namespace == "ctxcore.control"
        configure(settings)  # a reconfigured app talks to the new deployment's exchanges
        assert app.control.mailbox.namespace == f"{prefix}.control"
        assert app.amqp.default_queue.name == f"{prefix}.jobs"
        assert app.backend.task_keyprefix == f"{prefix}:celery-task-meta-".encode()
    finally:
        configure(Settings())


def test_a_lock_on_an_unreachable_redis_is_store_unavailable() -> None:
    from ctxcore.errors import StoreUnavailable
    from tests.chaos.processes import free_port, quick_client
    from workers.locks import conversation_lock

    client = quick_client(f"redis://127.0.0.1:{free_port()}/0")
    # The stage task retries this like a transient failure (and DELETE answers 503).
    with pytest.raises(StoreUnavailable, match="lock"), conversation_lock(client, "fs", KEY):
        pass
