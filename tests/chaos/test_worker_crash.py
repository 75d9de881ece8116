"""Worker crash: real Celery worker processes are ``kill -9``-ed in the middle of model calls
and right after a model reply (while the stage parses, saves with CAS and sends the next
stage), then restarted. Every conversation must end compacted with a valid state history,
and the log must be exactly what was appended.

What makes this hold (workers/app.py): ``task_acks_late`` + ``task_reject_on_worker_lost``
(a lost child's task is redelivered at once); the Redis transport's ``visibility_timeout``
with ``unacked_restore_interval=2, unacked_restore_throttle=1`` (a dead worker's unacked
messages come back within seconds); idempotent stages (a stale ``based_on_version`` is a
conflict and re-plans); per-conversation locks with a timeout; scheduler leases
(``4 x hard_time_limit``), after which a re-request re-queues a job whose worker died.

Both brokers: on RabbitMQ (``rabbitmq`` marker) a killed worker's deliveries return when its
connection closes, the deployment runs a stages node (killed) and a drain node as
``ctxcore worker`` does, and the test prints how long each interrupted stage took to be
received again after its kill (the goal: within 10 s). Each run has its own key prefix,
hence its own queues and exchanges, deleted afterwards.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from celery import Celery

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from tests.chaos.helpers import LONG, agent_round, block_responder, conversation_problems
from tests.chaos.processes import WorkerProcess, broker_idle, worker_env
from tests.rabbitmq import ready_messages
from workers.app import celery_config, queue_names
from workers.runtime import Runtime

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(400 if LONG else 240),
]

CONVERSATIONS = 20
ROUNDS = 4 if LONG else 3
KILLS = 12 if LONG else 6
BUDGET = 1600
MODEL_DELAY = 0.6
# Short limits for the test only (production defaults are untouched): stage time limits
# of 2.5/3 s give a scheduler lease of 12 s; unacked messages come back after 3 s.
WORKER_LIMITS = {
    "soft_time_limit": 2.5,
    "hard_time_limit": 3.0,
    "visibility_timeout": 3,
    "lock_timeout": 3,
    "retry_delays": [0.2, 0.4, 0.8],
    "circuit_failure_threshold": 1000,
    # A ring whose drain token died with a killed worker waits for the reconciler (every
    # requeue_after / 2): 30 s by default, which left jobs stalled past the test's deadline.
    "requeue_after_seconds": 3.0,
}


class _Tracked:
    """Counts requests in flight and replies about to be sent, for timing the kills."""

    def __init__(self) -> None:
        self.replied = threading.Event()
        self.replies = 0

    def __call__(self, request: dict[str, object]) -> str:
        # Called just before the reply is written: the worker is about to parse and save.
        self.replies += 1
        self.replied.set()
        return block_responder(request)  # type: ignore[arg-type]


@dataclass
class Deployment:
    """One test deployment: its settings, its workers' environment, the broker's URL."""

    settings: Settings
    variables: dict[str, str]
    amqp_url: str | None

    def idle(self, rt: Runtime) -> bool:
        """No Celery message of the deployment waits in its queues (nor, on Redis, unacked)."""
        if self.amqp_url is None:
            return broker_idle(rt.redis, self.settings.redis.key_prefix)
        return ready_messages(self.amqp_url, queue_names(self.settings).consume_order()) == 0


BROKERS = [
    pytest.param("redis", id="redis"),
    pytest.param("rabbitmq", id="rabbitmq", marks=pytest.mark.rabbitmq),
]


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest, private_redis: str) -> Iterator[Deployment]:
    amqp_url = request.getfixturevalue("rabbitmq_url") if request.param == "rabbitmq" else None
    # rabbitmq_prefix deletes the queues and exchanges of its prefix after the test.
    prefix = request.getfixturevalue("rabbitmq_prefix") if amqp_url else f"crash{uuid.uuid4().hex[:6]}"
    broker = {"broker_url": amqp_url} if amqp_url else {}
    settings = Settings.load(
        {
            "redis": {"url": private_redis, "key_prefix": prefix},
            "engine": {"keep_recent_messages": 4},
            "worker": {**WORKER_LIMITS, **broker},
        }
    )
    variables = worker_env(private_redis, prefix, **WORKER_LIMITS)
    if amqp_url:
        variables["CTXCORE_BROKER_URL"] = amqp_url
    yield Deployment(settings, variables, amqp_url)


def test_kill_9_workers_during_model_calls_and_commits(env: Deployment, tmp_path: Path) -> None:
    settings, variables = env.settings, env.variables
    rt = Runtime(settings)
    sender = Celery("chaos-client")
    sender.conf.update(celery_config(settings))
    rng = random.Random(8)
    keys = [ConversationKey(f"tenant-{n % 4}", f"conv-{n:02d}") for n in range(CONVERSATIONS)]
    appended: dict[ConversationKey, list[AnyMessage]] = {k: [] for k in keys}

    def request(key: ConversationKey) -> None:
        # What the fast path does when a window is over its trigger.
        if rt.scheduler.request(key):
            sender.send_task("ctxcore.drain", queue=queue_names(settings).jobs, ignore_result=True)

    def append_round(r: int) -> None:
        for key in keys:
            batch = agent_round(rng, f"{key.conversation_id}-r{r}", steps=rng.randint(2, 4))
            rt.log.append(key, batch)
            appended[key].extend(batch)
            rt.state_store.set_budget(key, BUDGET)
            request(key)

    tracked = _Tracked()
    kills: list[str] = []
    kill_times: list[float] = []
    names = queue_names(settings)
    with OpenAIServer(delay=MODEL_DELAY, responder=tracked) as server:
        variables = {**variables, "CTXCORE_MODEL_BASE_URL": server.base_url, "CTXCORE_MODEL__TIMEOUT": "5"}
        # Redis: one worker on both queues (stages first). RabbitMQ: the stages node (the one
        # killed: it runs the model calls and commits) and a drain node, as ctxcore worker runs.
        worker = WorkerProcess(
            variables,
            tmp_path / "worker.log",
            pool="prefork",
            concurrency=2,
            queues=names.stages if env.amqp_url else None,
        )
        drainer = WorkerProcess(
            variables, tmp_path / "drain.log", concurrency=1, name="drain", queues=names.jobs
        )
        worker.start()
        if env.amqp_url:
            drainer.start()
        try:
            for r in range(ROUNDS):
                append_round(r)
                for _ in range(KILLS // ROUNDS):
                    kills.append(_kill_once(worker, server, tracked, rng))
                    kill_times.append(time.time())
                    time.sleep(rng.uniform(0.5, 1.5))
                    if not worker.alive:
                        worker.start()
            # Recovery: keep asking (as windows over the trigger would) until every
            # conversation is within its target and nothing is queued or running.
            done = _wait_compacted(rt, keys, request, env, deadline=time.monotonic() + (240 if LONG else 120))
        finally:
            worker.stop()
            drainer.stop()
        calls = server.request_count

    log_text = (tmp_path / "worker.log").read_text(errors="replace")
    assert len(kills) == KILLS and worker.starts > 1, kills
    assert any(k.startswith("mid-call") for k in kills) and any(k.startswith("after-reply") for k in kills)
    # The kills interrupted work: some stage tasks were delivered more than once.
    received = re.findall(r"Task (ctxcore\.stage\.[a-z_0-9]+\[[0-9a-f-]+\]) received", log_text)
    redelivered = {t for t in received if received.count(t) > 1}
    assert redelivered, "no stage task was redelivered: the kills hit idle workers"
    assert done == set(keys), f"not compacted: {sorted(str(k) for k in set(keys) - done)}\n{log_text[-3000:]}"
    problems = [p for key in keys for p in conversation_problems(rt.state_store, rt.log, key, appended[key])]
    assert problems == [], problems[:10]
    for key in keys:
        state = rt.state_store.load(key)
        assert state is not None and state.version >= 1 and state.blocks, key
        assert rt.coordinator.plan(key) is None, key
    delays = redelivery_delays(log_text, kill_times)
    # A measurement, not an assert (timing goals are measured, never asserted): the issue's
    # goal is that on RabbitMQ a killed worker's stage is received again within 10 s.
    print(
        f"\nworker crash ({'rabbitmq' if env.amqp_url else 'redis'}): {len(kills)} kills {kills}, "
        f"{worker.starts} worker starts, {calls} model calls, {len(redelivered)} stage tasks redelivered; "
        f"stage received again after its kill: {', '.join(f'{d:.1f}' for d in delays)} s "
        f"(max {max(delays, default=0.0):.1f} s)"
    )


def _kill_once(worker: WorkerProcess, server: OpenAIServer, tracked: _Tracked, rng: random.Random) -> str:
    """Wait for a model call (or a reply) and ``kill -9`` the worker (or one pool child)."""
    mid_call = rng.random() < 0.5
    whole = rng.random() < 0.75
    deadline = time.monotonic() + 20
    if mid_call:
        seen = server.request_count
        while server.request_count == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.05, MODEL_DELAY * 0.8))
    else:
        tracked.replied.clear()
        tracked.replied.wait(max(deadline - time.monotonic(), 0))
        time.sleep(rng.uniform(0.0, 0.03))
    if whole:
        worker.kill()
    elif not worker.kill_child():
        worker.kill()
        whole = True
    return f"{'mid-call' if mid_call else 'after-reply'}/{'worker' if whole else 'child'}"


_TASK_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[\w-]+\] "
    r"Task ctxcore\.stage\.\w+\[([0-9a-f-]+)\] (received|succeeded|retry|raised)",
    re.MULTILINE,
)


def redelivery_delays(log_text: str, kill_times: list[float]) -> list[float]:
    """For each kill that interrupted a stage task (received, not finished before it): the
    seconds until one of those tasks was received again."""
    events = [
        (datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), task_id, what)
        for stamp, task_id, what in _TASK_LINE.findall(log_text)
    ]
    delays = []
    for killed_at in kill_times:
        last: dict[str, str] = {}
        for at, task_id, what in events:
            if at <= killed_at:
                last[task_id] = what
        running = {t for t, what in last.items() if what == "received"}
        again = [
            at for at, task_id, what in events if at > killed_at and what == "received" and task_id in running
        ]
        if again:
            delays.append(min(again) - killed_at)
    return delays


def _wait_compacted(
    rt: Runtime, keys: list[ConversationKey], request: object, env: Deployment, deadline: float
) -> set[ConversationKey]:
    assert callable(request)
    done: set[ConversationKey] = set()
    last_request = 0.0
    while time.monotonic() < deadline:
        done = {k for k in keys if rt.coordinator.plan(k) is None}
        idle = all(rt.scheduler.status(k) == "idle" for k in keys)
        if len(done) == len(keys) and idle and env.idle(rt):
            return done
        if time.monotonic() - last_request > 3:
            for key in set(keys) - done:
                request(key)
            last_request = time.monotonic()
        time.sleep(0.3)
    return done
