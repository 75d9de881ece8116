"""Redis (broker and store, append-only) killed while a stage waits for its retry, started
again 10 s later: the retry cannot be published and the stage is dropped. Within
``2 x worker.heartbeat_seconds + 30 s`` of Redis answering again the conversation is
``idle`` and compacted, or ``failing`` with ``lost_task`` (the reconciler queued the lost job
again); the summariser calls that answered equal the model stages that saved.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from ctxcore.config import Settings
from ctxcore.errors import StoreUnavailable
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from tests.chaos.helpers import agent_round, block_responder, conversation_problems
from tests.chaos.processes import RedisProcess, WorkerProcess, worker_env
from workers.runtime import Runtime

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(180)]

HEARTBEAT = 1.0
BUDGET = 3000
LIMITS = {
    "heartbeat_seconds": HEARTBEAT,
    "requeue_after_seconds": 2.0,  # a reconciler pass every second
    "retry_delays": [1.0, 1.0, 1.0],
    "lock_timeout": 5,
    # The retry's message, unacknowledged in Redis, would come back only after this: the
    # stage is lost for the whole test.
    "visibility_timeout": 600,
    "circuit_failure_threshold": 1000,
}


def _wait(predicate: object, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {timeout}s")


def test_a_stage_lost_while_redis_was_down_is_found_and_its_job_runs_again(tmp_path: Path) -> None:
    import random

    server = RedisProcess(tmp_path / "redis")  # append-only, fsync always: survives kill -9
    server.start()
    prefix = f"lost{uuid.uuid4().hex[:6]}"
    with OpenAIServer(responder=block_responder) as model:
        # The first call is rate-limited: the stage waits 4 s for its retry.
        model.push_fault("rate_limit", retry_after=4)
        settings = Settings.load(
            {
                "redis": {"url": server.url, "key_prefix": prefix},
                "model": {"base_url": model.base_url, "timeout": 10},
                "engine": {"keep_recent_messages": 4},
                "worker": LIMITS,
            }
        )
        worker = WorkerProcess(
            worker_env(server.url, prefix, model_url=model.base_url, **LIMITS),
            tmp_path / "worker.log",
            pool="threads",
        )
        rt = Runtime(settings)
        key = ConversationKey("tenant-l", "lost")
        rng = random.Random(3)
        for r in range(4):
            rt.log.append(key, agent_round(rng, f"lost-{r}", steps=3))
        rt.state_store.set_budget(key, BUDGET)
        from workers.app import configure
        from workers.tasks import CeleryQueue, request_compaction

        configure(settings)
        log = worker.log_path
        try:
            worker.start()
            _wait(lambda: "ready." in log.read_text(), 30, "the worker")
            assert request_compaction(key) == "queued"
            _wait(lambda: "retry in" in log.read_text(), 20, "the stage's retry")
            server.kill()  # the retry is due in ~4 s: it runs while Redis is down
            time.sleep(10)
            server.start()
            back = time.monotonic()
            outcome: list[str] = []

            def settled() -> bool:
                # kombu may end a worker whose broker connection dropped under it: restart
                # it, as a supervisor does.
                if not worker.alive:
                    worker.start()
                try:
                    record = rt.failures.get(key)
                    error = record.detail.last_error
                    if error is not None and error.kind == "lost_task":
                        outcome.append("failing: lost_task")
                        return True
                    if rt.scheduler.status(key) == "idle" and rt.coordinator.plan(key) is None:
                        outcome.append("idle")
                        return not record.failing
                except StoreUnavailable:
                    return False
                return False

            _wait(settled, 2 * HEARTBEAT + 30, "idle or failing with lost_task after Redis came back")
            print(f"\nsettled {time.monotonic() - back:.1f} s after Redis came back: {outcome[-1]}")
            # Then the lost job runs again to the end.
            _wait(
                lambda: rt.scheduler.status(key) == "idle" and rt.coordinator.plan(key) is None,
                30,
                "the job compacting the conversation",
            )
            assert CeleryQueue().status(key) == "idle"
        finally:
            configure(Settings())
            worker.stop()
        text = log.read_text()
        assert "lost_task" in text, "the reconciler never found the lost job"
        saved = re.findall(r"stage done: {[^}]*'stage': '(\w+)', 'outcome': 'compressed'", text)
        model_saves = [s for s in saved if s != "hard_truncate"]
        answered = len(model.requests) - 1  # the rate-limited call answered nothing
        assert answered == len(model_saves), (answered, saved)
        assert conversation_problems(rt.state_store, rt.log, key) == []
    server.kill()
