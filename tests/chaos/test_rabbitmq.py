"""RabbitMQ as Celery's broker (``worker.broker_url`` ``amqp://``; docs/reliability.md).

- A stage whose endpoint refuses connections ``RETRY``s through Celery's native delayed
  delivery (quorum queues cannot hold an ETA) and the retried task comes back to a worker.
- A message returned ``worker.delivery_limit`` times (as when its stage kills the worker
  every time) is dead-lettered to ``<prefix>.dead``: ``/metrics`` shows the depth and the
  reconciler logs it once, at ERROR, with its task and conversation.
- A drain holds its token while the stages queue holds ``worker.concurrency`` ready
  messages, and starts once it holds fewer.
- While the broker does not answer, windows are served and the job stays queued; once it
  answers, the workers' reconciler starts it and nothing acknowledged is lost.
- A broker URL with a wrong password fails ``ctxcore worker``'s start, naming the host and
  never the password.

Every test has its own key prefix (its own queues and exchanges), deleted afterwards.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from kombu import Connection

from ctxcore.config import Settings
from ctxcore.state import ConversationKey
from tests.chaos.celery_helpers import EventLog, in_process_worker
from tests.chaos.helpers import agent_round, conversation_problems
from tests.chaos.processes import free_port
from tests.integration.test_cli import run_cli
from workers.keyspace import delete_prefixed_keys

pytestmark = [pytest.mark.rabbitmq, pytest.mark.chaos, pytest.mark.timeout(60)]


def _settings(redis_url: str, amqp_url: str, prefix: str, **worker: Any) -> Settings:
    model = worker.pop("model", {})
    return Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "model": model,
            "engine": {"keep_recent_messages": 4},
            "worker": {"broker_url": amqp_url, "lock_timeout": 5, **worker},
        }
    )


@pytest.fixture()
def deployment(redis_url: str, rabbitmq_url: str, rabbitmq_prefix: str) -> Iterator[tuple[str, str, str]]:
    """Redis and RabbitMQ URLs and this test's key prefix; its Redis keys go afterwards."""
    yield redis_url, rabbitmq_url, rabbitmq_prefix
    from workers.app import configure

    configure(Settings())
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed_keys(client, rabbitmq_prefix)
    finally:
        client.close()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s")
        time.sleep(0.05)


def test_a_refused_endpoint_retries_through_native_delayed_delivery_and_the_retry_comes_back(
    deployment: tuple[str, str, str],
) -> None:
    from workers.tasks import request_compaction

    redis_url, amqp_url, prefix = deployment
    settings = _settings(
        redis_url,
        amqp_url,
        prefix,
        model={"base_url": f"http://127.0.0.1:{free_port()}/v1", "timeout": 2},
        retry_delays=[0.3],
        circuit_failure_threshold=1000,
        # The worker's event loop sleeps until its next timer (the reconciler's, every
        # requeue_after / 2) before it sees a stop: a short one keeps the shutdown short.
        requeue_after_seconds=1.0,
    )
    key = ConversationKey("tenant-r", "retried")
    with in_process_worker(settings) as rt, EventLog() as events:
        rng = random.Random(3)
        for r in range(4):
            rt.log.append(key, agent_round(rng, f"retried-{r}", steps=3))
        rt.state_store.set_budget(key, 3000)
        assert request_compaction(key) == "queued"
        _wait(lambda: rt.failures.get(key).failing, 20, "the recorded failure")
        # The failure is recorded (on_failure) before Celery's task-failed event is sent and
        # consumed: wait for the event too.
        _wait(lambda: events.tasks("ctxcore.stage.", "task-failed"), 10, "the task-failed event")
        (failed,) = events.tasks("ctxcore.stage.", "task-failed")
        types = events.types(failed["uuid"])
        # RETRY, then the same task received again (from the delayed-delivery exchanges), then FAILURE.
        assert types.count("task-retried") == 1, types
        retried_at = types.index("task-retried")
        assert "task-received" in types[retried_at:], types
        assert "server_unstable" in failed["exception"]


def test_a_message_delivered_delivery_limit_times_is_dead_lettered_shown_and_logged_once(
    deployment: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    from workers.app import app, configure, queue_names
    from workers.broker import check_broker
    from workers.broker_queues import dead_letter_depth
    from workers.dead_letters import report_dead_letters
    from workers.http import create_app
    from workers.runtime import Runtime

    redis_url, amqp_url, prefix = deployment
    settings = _settings(redis_url, amqp_url, prefix, delivery_limit=3)
    check_broker(settings)  # declares <prefix>.dead, as ctxcore worker / serve do
    configure(settings)
    names = queue_names(settings)
    app.send_task(
        "ctxcore.stage.l0_to_l1",
        args=["tenant-p", "poison", {}, []],
        queue=names.stages,
        argsrepr="tenant-p/poison",
        ignore_result=True,
    )
    # A consumer that dies on it each time: every delivery is returned unacknowledged.
    deliveries = 0
    with Connection(amqp_url) as conn:
        channel = conn.channel()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = channel.basic_get(queue=names.stages, no_ack=False)
            if message is None:
                if dead_letter_depth(settings):
                    break
                time.sleep(0.05)
                continue
            deliveries += 1
            channel.basic_reject(message.delivery_tag, requeue=True)
        channel.close()
    assert deliveries == settings.worker.delivery_limit + 1, deliveries
    assert dead_letter_depth(settings) == 1

    client = redis.Redis.from_url(redis_url)
    try:
        with caplog.at_level(logging.ERROR, logger="workers.dead_letters"):
            assert report_dead_letters(settings, client) == 1
            _wait(lambda: dead_letter_depth(settings) == 1, 5, "the dead letter back in its queue")
            assert report_dead_letters(settings, client) == 0  # read again, logged once
        (record,) = [r for r in caplog.records if r.name == "workers.dead_letters"]
        assert record.levelno == logging.ERROR
        assert "ctxcore.stage.l0_to_l1" in record.getMessage() and "tenant-p/poison" in record.getMessage()
        # The reconciler puts what it read back: the message stays for an operator.
        _wait(lambda: dead_letter_depth(settings) == 1, 5, "the dead letter back in its queue")
    finally:
        client.close()

    with TestClient(create_app(Runtime(settings))) as api:
        text = api.get("/metrics").text
    assert "# TYPE ctxcore_dead_letter_messages gauge" in text
    assert "\nctxcore_dead_letter_messages 1.0\n" in text


def test_a_drain_holds_its_token_while_the_stages_queue_is_full(deployment: tuple[str, str, str]) -> None:
    from workers.app import app, configure, queue_names
    from workers.broker_queues import wait_for_stage_room

    redis_url, amqp_url, prefix = deployment
    settings = _settings(redis_url, amqp_url, prefix, concurrency=2)
    configure(settings)
    stages = queue_names(settings).stages
    for n in range(2):
        app.send_task("ctxcore.stage.l0_to_l1", args=["t", f"c{n}", {}, []], queue=stages, ignore_result=True)
    waited: list[float] = []
    drain = threading.Thread(target=lambda: waited.append(wait_for_stage_room(settings)), daemon=True)
    drain.start()
    drain.join(1.5)
    assert drain.is_alive(), "the drain started a job with the stages queue full"
    with Connection(amqp_url) as conn:
        channel = conn.channel()
        message = channel.basic_get(queue=stages, no_ack=False)
        assert message is not None
        channel.basic_ack(message.delivery_tag)
        channel.close()
    drain.join(5)
    assert not drain.is_alive() and waited and waited[0] >= 1.5


def test_a_wrong_broker_password_fails_the_start_naming_the_host_not_the_password(
    deployment: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    redis_url, amqp_url, prefix = deployment
    host = amqp_url.split("@", 1)[1].split("/", 1)[0]
    wrong = f"amqp://guest:not-the-password-{prefix[-6:]}@{host}//"
    env = {"CTXCORE_REDIS_URL": redis_url, "CTXCORE_REDIS__KEY_PREFIX": prefix, "CTXCORE_BROKER_URL": wrong}
    code, out = run_cli("worker", env=env)
    err = capsys.readouterr().err
    assert code == 2, (out, err)
    assert host in err and "refused the login" in err, err
    assert "not-the-password" not in err + out


def test_while_the_broker_is_unreachable_windows_are_served_and_the_queued_job_starts_once_it_answers(
    deployment: tuple[str, str, str],
) -> None:
    """The machine's RabbitMQ is shared, so the outage is a broker URL on a closed port
    (the same deployment, same Redis), then the real one: what a stopped and restarted
    broker looks like to the API and the workers."""
    from workers.app import configure
    from workers.runtime import Runtime, build_service
    from workers.tasks import CeleryQueue

    redis_url, amqp_url, prefix = deployment
    limits = {"requeue_after_seconds": 1.0}
    down = _settings(redis_url, f"amqp://guest:guest@127.0.0.1:{free_port()}//", prefix, **limits)
    configure(down)
    rt = Runtime(down)
    service = build_service(rt, CeleryQueue())
    key = ConversationKey("tenant-o", "outage")
    rng = random.Random(5)
    appended = [m for r in range(4) for m in agent_round(rng, f"outage-{r}", steps=3)]
    ids = service.append(key, appended)
    window = service.get_window(key, 3000)
    # Served from Redis alone; the job is queued in the scheduler, its drain token not sent.
    assert window.messages and window.compaction == "queued"
    assert rt.scheduler.status(key) == "queued"

    up = _settings(redis_url, amqp_url, prefix, **limits)
    with in_process_worker(up) as worker_rt:
        # The worker's reconciler finds the ring without a token and sends one.
        _wait(
            lambda: worker_rt.coordinator.plan(key) is None, 30, "the compaction after the broker came back"
        )
        _wait(lambda: worker_rt.scheduler.status(key) == "idle", 10, "the job's end")
    state = rt.state_store.load(key)
    assert state is not None and state.blocks  # the job ran: a compaction was saved
    # Nothing acknowledged was lost: the log is what was appended, the state is sound.
    assert len(ids) == len(appended)
    assert conversation_problems(rt.state_store, rt.log, key, appended) == []
