"""Failures are visible and no job is stranded, through a real Celery worker.

- A bug in a stage (a ``TypeError``) is a ``FAILURE`` task with its traceback, the state is
  untouched, the job finishes at once, and the API says ``failing`` with
  ``last_error.kind == "internal"``; the conversation is not queued again during its backoff.
- An endpoint that refuses connections: the stage ``RETRY``s, then ``FAILURE``s with the
  cause ("Connection refused") in ``last_error``; after the cause goes away and the backoff
  passes, the next request's job succeeds and clears it.
- A drain token eaten by a consumer that does nothing: the worker's reconciler sends a new
  one and the job completes within ``2 x worker.requeue_after_seconds``.
- Redis (append-only, fsync always) killed and restarted while a stage waits on the model:
  nothing appended is lost, no block is written twice, and the job finishes soon after.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.messages import AnyMessage
from ctxcore.state import ConversationKey
from ctxcore.summarize.model import Completion, OutputContract
from ctxcore.testing import OpenAIServer
from tests.chaos.celery_helpers import EventLog, in_process_worker
from tests.chaos.helpers import agent_round, block_responder, conversation_problems
from tests.chaos.processes import RedisProcess, WorkerProcess, free_port, worker_env
from workers.runtime import Runtime

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

BUDGET = 3000
TOKEN = "failure-paths-token"


def _settings(url: str, **worker: Any) -> Settings:
    model = worker.pop("model", {})
    return Settings.load(
        {
            "redis": {"url": url, "key_prefix": f"fail{uuid.uuid4().hex[:6]}"},
            "model": model,
            "engine": {"keep_recent_messages": 4},
            "http": {"tokens": {hash_token(TOKEN): "tenant-f"}},
            "worker": {"retry_delays": [0.05, 0.1, 0.15], "lock_timeout": 5, **worker},
        }
    )


def _fill(rt: Runtime, key: ConversationKey, rounds: int = 4, seed: int = 1) -> None:
    rng = random.Random(seed)
    for r in range(rounds):
        rt.log.append(key, agent_round(rng, f"{key.conversation_id}-{r}", steps=3))
    rt.state_store.set_budget(key, BUDGET)


def _wait(predicate: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{what} not within {timeout}s")


class _TypeErrorModel:
    """A model client with a bug: every call raises ``TypeError``."""

    name = "buggy"

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


def test_a_type_error_in_a_stage_fails_the_task_keeps_the_state_and_finishes_the_job(
    private_redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    from workers.app import app
    from workers.http import create_app
    from workers.tasks import CeleryQueue, request_compaction

    settings = _settings(private_redis, failure_backoff_seconds=60)
    key = ConversationKey("tenant-f", "buggy")
    with in_process_worker(settings) as rt, EventLog() as events, caplog.at_level(logging.INFO):
        _fill(rt, key)
        rt.coordinator.model_for = lambda _key: _TypeErrorModel()
        assert request_compaction(key) == "queued"
        _wait(lambda: events.tasks("ctxcore.stage.", "task-failed"), 15, "the stage's FAILURE")
        _wait(lambda: rt.scheduler.status(key) == "idle", 5, "the job's end")

        (failed,) = events.tasks("ctxcore.stage.", "task-failed")
        assert failed["name"] == "ctxcore.stage.l0_to_l1"
        assert "TypeError" in failed["exception"] and "Traceback" in failed["traceback"]
        assert "task-retried" not in events.types(failed["uuid"])  # a bug is not retried
        assert app.backend.get_task_meta(failed["uuid"])["status"] == "FAILURE"  # the result backend
        assert rt.state_store.load(key) is None  # untouched: nothing was saved
        assert conversation_problems(rt.state_store, rt.log, key) == []

        error = rt.failures.detail(key).last_error
        assert error is not None and error.kind == "internal" and error.stage == "l0_to_l1"
        assert error.message.startswith("TypeError: unsupported operand")
        assert CeleryQueue().status(key) == "failing"
        assert any(
            r.levelno == logging.ERROR
            and "kind=internal TypeError" in r.getMessage()
            and str(key) in r.getMessage()
            for r in caplog.records
        )

        # The API shows it; windows over the trigger and POST .../compact do not queue it
        # again during the backoff.
        client = TestClient(create_app(rt, CeleryQueue()))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        state = client.get(f"/v1/conversations/{key.conversation_id}/state", headers=auth).json()
        assert state["compaction_detail"]["last_error"]["kind"] == "internal"
        window = client.post(
            f"/v1/conversations/{key.conversation_id}/window", json={"budget_tokens": BUDGET}, headers=auth
        ).json()
        assert window["compaction"] == "failing"
        assert window["compaction_detail"]["last_error"]["message"].startswith("TypeError")
        compact = client.post(f"/v1/conversations/{key.conversation_id}/compact", headers=auth)
        assert compact.status_code == 202 and compact.json() == {"status": "failing"}
        assert rt.scheduler.status(key) == "idle"
        assert len(events.tasks("ctxcore.drain")) == 1  # no new job was started


def test_a_refused_endpoint_fails_visibly_backs_off_and_recovers_when_the_cause_goes_away(
    private_redis: str,
) -> None:
    from workers.tasks import CeleryQueue, request_compaction

    port = free_port()
    settings = _settings(
        private_redis,
        model={"base_url": f"http://127.0.0.1:{port}/v1", "timeout": 2},
        failure_backoff_seconds=1.0,
        failure_backoff_max_seconds=4.0,
        circuit_failure_threshold=1000,
    )
    key = ConversationKey("tenant-f", "refused")
    with in_process_worker(settings) as rt, EventLog() as events:
        _fill(rt, key)
        assert request_compaction(key) == "queued"
        _wait(lambda: rt.failures.get(key).failing, 15, "the recorded failure")
        _wait(lambda: rt.scheduler.status(key) == "idle", 5, "the job's end")
        # The failure is recorded before Celery's task-failed event arrives: wait for it too.
        _wait(lambda: events.tasks("ctxcore.stage.", "task-failed"), 10, "the stage's FAILURE")
        (failed,) = events.tasks("ctxcore.stage.", "task-failed")
        # Transient: RETRY once per configured delay, then FAILURE with the classified error.
        assert events.types(failed["uuid"]).count("task-retried") == len(settings.worker.retry_delays)
        assert "StageFailedError" in failed["exception"] and "server_unstable" in failed["exception"]
        error = rt.failures.detail(key).last_error
        assert error is not None and error.kind == "server_unstable"
        assert "Connection refused" in error.message, error.message
        # Every model stage would call the same endpoint: they were all exhausted, and with
        # no block to truncate the job ended; the state is untouched.
        assert len({e["uuid"] for e in events.tasks("ctxcore.stage.")}) == 1
        assert rt.state_store.load(key) is None
        assert request_compaction(key) == "failing" and rt.scheduler.status(key) == "idle"

        with OpenAIServer(port=port, responder=block_responder):
            # Within one backoff period (1 s) of the cause going away, a request starts a job.
            deadline = time.monotonic() + 3.0
            while rt.scheduler.status(key) == "idle" and time.monotonic() < deadline:
                request_compaction(key)
                time.sleep(0.1)
            _wait(lambda: not rt.failures.get(key).failing, 15, "the recovery")
            _wait(lambda: rt.scheduler.status(key) == "idle", 5, "the job's end")
        detail = rt.failures.detail(key)
        assert detail.last_error is None and detail.last_success_at is not None
        assert CeleryQueue().status(key) == "idle"
        assert rt.coordinator.plan(key) is None  # compacted
        assert conversation_problems(rt.state_store, rt.log, key) == []


def test_a_lost_drain_token_is_resent_and_the_job_completes_within_twice_requeue_after(
    private_redis: str,
) -> None:
    from workers.app import app, configure, queue_names, runtime
    from workers.tasks import request_compaction

    requeue_after = 3.0
    settings = _settings(private_redis, requeue_after_seconds=requeue_after)
    key = ConversationKey("tenant-f", "lost-token")
    configure(settings)
    try:
        rt = runtime()
        _fill(rt, key)
        sent = time.monotonic()
        assert request_compaction(key) == "queued"
        # A consumer that takes the token and does nothing with it.
        with app.connection_for_write() as conn:
            queue = conn.SimpleQueue(queue_names(settings).jobs)
            message = queue.get(timeout=5)
            assert message.headers["task"] == "ctxcore.drain"
            message.ack()
            queue.close()
        assert rt.scheduler.status(key) == "queued"
    finally:
        configure(Settings())
    with in_process_worker(settings) as rt, EventLog() as events:
        _wait(lambda: rt.scheduler.status(key) == "idle", 2 * requeue_after, "the job's end")
        elapsed = time.monotonic() - sent
        assert rt.coordinator.plan(key) is None  # compacted
        assert elapsed <= 2 * requeue_after, elapsed
        # One token was re-sent for the one stuck job, not one per reconciler tick.
        time.sleep(requeue_after)
        assert len(events.tasks("ctxcore.drain")) == 1


def test_redis_restarting_mid_stage_loses_nothing_and_the_job_finishes(tmp_path: Path) -> None:
    from ctxcore.errors import StoreUnavailable
    from workers.app import configure
    from workers.runtime import build_service
    from workers.tasks import CeleryQueue, request_compaction

    server = RedisProcess(tmp_path / "redis")  # append-only, fsync always: survives kill -9
    server.start()
    limits = {
        "retry_delays": [0.5, 1.0, 2.0],
        "lock_timeout": 5,
        "visibility_timeout": 3,
        "failure_backoff_seconds": 1.0,
        "failure_backoff_max_seconds": 2.0,
        "circuit_failure_threshold": 1000,
    }
    with OpenAIServer(responder=block_responder, delay=1.5) as model:
        settings = _settings(server.url, model={"base_url": model.base_url, "timeout": 10}, **limits)
        prefix = settings.redis.key_prefix
        worker = WorkerProcess(
            worker_env(server.url, prefix, model_url=model.base_url, **limits),
            tmp_path / "worker.log",
            pool="threads",
        )
        rt = Runtime(settings)
        key = ConversationKey("tenant-f", "outage")
        _fill(rt, key)
        appended = rt.log.read_after(key, None)
        configure(settings)
        service = build_service(rt, CeleryQueue())
        try:
            worker.start()
            _wait(lambda: "ready." in worker.log_path.read_text(), 30, "the worker")
            assert request_compaction(key) == "queued"
            _wait(lambda: model.request_count >= 1, 15, "the first model call")
            server.kill()  # mid-stage: the model call is still running
            time.sleep(1.0)
            server.start()
            back = time.monotonic()

            def done() -> bool:
                # kombu 5.7 ends a worker whose broker connection drops while it holds an
                # unacknowledged message (AttributeError in Channel.close): restart it, as
                # the compose restart policy does; the message comes back after the
                # visibility timeout.
                if not worker.alive:
                    worker.start()
                try:
                    # What the agents' windows do meanwhile (held back while failing).
                    service.get_window(key, BUDGET)
                    return (
                        rt.scheduler.status(key) == "idle"
                        and rt.coordinator.plan(key) is None
                        and not rt.failures.get(key).failing
                    )
                except StoreUnavailable:
                    return False

            # The lost or failed stage comes back (visibility timeout 3 s, retries, at worst
            # one backoff of 1-2 s): well within 30 s of Redis answering again.
            _wait(done, 30, "the job finishing after the restart")
            assert time.monotonic() - back < 30
        finally:
            configure(Settings())
            worker.stop()
        assert [m.model_copy(update={"context_message_id": None}) for m in rt.log.read_after(key, None)] == [
            m.model_copy(update={"context_message_id": None}) for m in appended
        ]
        assert conversation_problems(rt.state_store, rt.log, key) == []
        state = rt.state_store.load(key)
        assert state is not None and state.blocks
    server.kill()
