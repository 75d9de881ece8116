"""The local server's 12 faults x the 4 model stages through a real worker, as Flower sees them.

Each stage task is sent to an in-process Celery worker while the local OpenAI-compatible
server answers with one fault (pushed once per attempt), and the task's events are captured
with ``app.events.Receiver``, which is what Flower reads: a transient kind is ``RETRY``-ed
once per ``worker.retry_delays`` entry and then ``FAILURE``s, a permanent kind ``FAILURE``s at
once, ``wrong_block_ids`` is a stage that succeeds as ``skipped``. Within 1 s of the final
failure the API says ``failing`` and ``last_error`` names the cause; the state is untouched.
The task is sent with every other stage kind exhausted, so its follow-up plans nothing and
one stage record serves all twelve faults; then the stage succeeds in-process and the next
stage kind is planned, as in ``test_model_faults``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator

import pytest

from ctxcore.config import Settings
from ctxcore.pipeline import STAGE_ORDER
from ctxcore.state import ConversationKey
from ctxcore.summarize.errors import TRANSIENT_KINDS
from ctxcore.testing import OpenAIServer
from tests.chaos.celery_helpers import EventLog, in_process_worker
from tests.chaos.helpers import agent_round, block_responder, conversation_problems
from workers.runtime import Runtime

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]

BUDGET = 3000
MODEL_STAGES = [k for k in STAGE_ORDER if k != "hard_truncate"]
RETRY_DELAYS = [0.05, 0.1, 0.15]

# fault -> (error kind, or None for a skipped stage; a word of the cause in last_error.message)
FAULTS: dict[str, tuple[str | None, str]] = {
    "rate_limit": ("rate_limit", "429"),
    "server_error": ("server_unstable", "500"),
    "unavailable": ("server_unstable", "503"),
    "too_large": ("context_overflow", "413"),
    "overflow": ("context_overflow", "maximum context length"),
    "auth": ("authentication", "401"),
    "bad_request": ("api_request_error", "Invalid value for 'temperature'"),
    "timeout": ("timeout", "timed out"),
    "invalid_json": ("unknown", "JSONDecodeError"),
    "empty": ("unknown", "no text"),
    "disconnect": ("server_unstable", "Connection error"),
    "wrong_block_ids": (None, ""),
}


@pytest.fixture()
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(responder=block_responder, timeout_delay=2.0) as s:
        yield s


@pytest.fixture()
def worker(private_redis: str, server: OpenAIServer) -> Iterator[Runtime]:
    settings = Settings.load(
        {
            "redis": {"url": private_redis, "key_prefix": f"states{uuid.uuid4().hex[:6]}"},
            "model": {"base_url": server.base_url, "timeout": 0.6},
            "engine": {"keep_recent_messages": 4},
            "worker": {"retry_delays": RETRY_DELAYS, "lock_timeout": 5, "circuit_failure_threshold": 1000},
        }
    )
    with in_process_worker(settings) as rt:
        yield rt


def _fill(rt: Runtime, key: ConversationKey, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    for r in range(rounds):
        rt.log.append(key, agent_round(rng, f"{key.conversation_id}-{seed}-{r}", steps=3))
    rt.state_store.set_budget(key, BUDGET)


def test_every_fault_at_every_model_stage_in_the_events_flower_reads(
    worker: Runtime, server: OpenAIServer
) -> None:
    from workers.app import app
    from workers.failures import StageFailedError
    from workers.tasks import CeleryQueue, send_stage

    rt = worker
    key = ConversationKey("tenant-s", "matrix")
    _fill(rt, key, rounds=8, seed=1)
    grown = 0
    seen: list[tuple[str, str]] = []
    with EventLog() as events:
        for index, kind in enumerate(MODEL_STAGES):
            stage = rt.coordinator.plan(key, exhausted=MODEL_STAGES[:index])
            while stage is None and grown < 10:
                grown += 1  # the previous stage brought the view within target: grow it
                _fill(rt, key, rounds=3, seed=100 + grown)
                stage = rt.coordinator.plan(key, exhausted=MODEL_STAGES[:index])
            assert stage is not None and stage.kind == kind, (kind, stage)
            others = [k for k in STAGE_ORDER if k != kind]
            before = rt.state_store.load(key)
            before_json = before.model_dump_json() if before else None
            for fault, (error_kind, cause) in FAULTS.items():
                attempts = 1 + len(RETRY_DELAYS) if error_kind in TRANSIENT_KINDS else 1
                for _ in range(attempts):
                    server.push_fault(fault, retry_after=0.05)
                task_id = send_stage(key, stage, others).id
                final = events.final(task_id)
                types = events.types(task_id)
                where = (kind, fault, types)
                if error_kind is None:
                    assert final["type"] == "task-succeeded" and "'skipped'" in final["result"], where
                    assert "task-retried" not in types, where
                else:
                    failed_at = time.monotonic()
                    assert final["type"] == "task-failed", where
                    assert "StageFailedError" in final["exception"] and error_kind in final["exception"], (
                        where
                    )
                    expected_retries = attempts - 1
                    assert types.count("task-retried") == expected_retries, where
                    while CeleryQueue().status(key) != "failing" and time.monotonic() - failed_at < 1.0:
                        time.sleep(0.01)
                    assert CeleryQueue().status(key) == "failing", where
                    error = rt.failures.detail(key).last_error
                    assert error is not None and (error.kind, error.stage) == (error_kind, kind), where
                    assert cause in error.message, (where, error.message)
                    assert error.message in final["exception"] or cause in final["exception"], where
                    meta = app.backend.get_task_meta(task_id)
                    assert meta["status"] == "FAILURE", where
                    rebuilt = app.backend.exception_to_python(meta["result"])
                    assert isinstance(rebuilt, StageFailedError) and rebuilt.kind == error_kind, where
                assert server.pending == 0, where  # every attempt reached the endpoint
                after = rt.state_store.load(key)
                assert (after.model_dump_json() if after else None) == before_json, where
                seen.append((kind, fault))
            # Then the stage succeeds (in-process) and the next kind is planned on the new state.
            result = rt.coordinator.run_stage(key, stage)
            assert result.outcome == "compressed", (kind, result.detail)
            assert conversation_problems(rt.state_store, rt.log, key) == []
    assert len(seen) == len(MODEL_STAGES) * len(FAULTS)
