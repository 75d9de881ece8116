"""Model faults from the local OpenAI-compatible server at every model-calling stage.

Every fault kind (429 with Retry-After, 500/503, 413, overflow, auth, bad request, timeout,
invalid JSON, empty, wrong block ids, dropped connection) is injected into each of the
four model stages through the real ``openai`` client: the stage fails (or is skipped) with
the right kind and ``Retry-After``, the saved state is byte-for-byte unchanged, and the
served window still fits. Then the same faults go through a real Celery worker: failures
are counted by kind in the shared metrics, the stage retries and the conversation ends
compacted; and the circuit breaker opens, refuses without calling the endpoint, and
half-opens.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ctxcore.config import Settings
from ctxcore.pipeline import STAGE_ORDER
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from tests.chaos.helpers import agent_round, block_responder, conversation_problems
from workers.prom_worker import stage_metrics
from workers.runtime import Runtime, build_service
from workers.service import InlineQueue

pytestmark = [pytest.mark.chaos]

BUDGET = 3000
MODEL_STAGES = [k for k in STAGE_ORDER if k != "hard_truncate"]

# fault -> (expected outcome, expected error kind)
FAULTS: dict[str, tuple[str, str | None]] = {
    "rate_limit": ("failed", "rate_limit"),
    "server_error": ("failed", "server_unstable"),
    "unavailable": ("failed", "server_unstable"),
    "too_large": ("failed", "context_overflow"),
    "overflow": ("failed", "context_overflow"),
    "auth": ("failed", "authentication"),
    "bad_request": ("failed", "api_request_error"),
    "timeout": ("failed", "timeout"),
    "invalid_json": ("failed", "unknown"),
    "empty": ("failed", "unknown"),
    "disconnect": ("failed", "server_unstable"),
    "wrong_block_ids": ("skipped", None),
}


def _settings(url: str, model_url: str, **worker: Any) -> Settings:
    return Settings.load(
        {
            "redis": {"url": url, "key_prefix": f"faults{uuid.uuid4().hex[:6]}"},
            "model": {"base_url": model_url, "timeout": 0.6},
            "engine": {"keep_recent_messages": 4},
            "worker": {"retry_delays": [0.1, 0.2, 0.3], "lock_timeout": 5, **worker},
        }
    )


@pytest.fixture()
def db_url(private_redis: str) -> str:
    return private_redis


@pytest.fixture()
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(responder=block_responder, timeout_delay=2.0) as s:
        yield s


def _fill(rt: Runtime, key: ConversationKey, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    for r in range(rounds):
        rt.log.append(key, agent_round(rng, f"{key.conversation_id}-{seed}-{r}", steps=3))
    rt.state_store.set_budget(key, BUDGET)


def _window_fits(rt: Runtime, key: ConversationKey) -> None:
    service = build_service(rt, InlineQueue())
    window = service.get_window(key, BUDGET)
    assert TiktokenCounter().count_messages(window.messages) <= BUDGET
    assert check_window(window.messages) == []


def test_every_fault_at_every_model_stage_leaves_the_state_untouched(
    db_url: str, server: OpenAIServer
) -> None:
    rt = Runtime(_settings(db_url, server.base_url, circuit_failure_threshold=1000))
    key = ConversationKey("tenant-f", "matrix")
    _fill(rt, key, rounds=8, seed=1)
    seen: dict[str, list[str]] = {}
    grown = 0
    for index, kind in enumerate(MODEL_STAGES):
        stage = rt.coordinator.plan(key, exhausted=list(MODEL_STAGES[:index]))
        while stage is None and grown < 10:
            # The previous stage brought the view within target: grow the conversation.
            grown += 1
            _fill(rt, key, rounds=3, seed=100 + grown)
            stage = rt.coordinator.plan(key, exhausted=list(MODEL_STAGES[:index]))
        assert stage is not None and stage.kind == kind, (kind, stage)
        before = rt.state_store.load(key)
        before_json = before.model_dump_json() if before else None
        for fault, (outcome, error_kind) in FAULTS.items():
            calls = server.request_count
            server.push_fault(fault, retry_after=2)
            result = rt.coordinator.run_stage(key, stage)
            assert server.request_count == calls + 1, (kind, fault)
            assert (result.outcome, result.error_kind) == (outcome, error_kind), (kind, fault, result.error)
            if fault == "rate_limit":
                assert result.retry_after == 2.0
            after = rt.state_store.load(key)
            assert (after.model_dump_json() if after else None) == before_json, (kind, fault)
            _window_fits(rt, key)
            seen.setdefault(kind, []).append(fault)
        # Then the stage succeeds and is saved; the next stage is planned on the new state.
        result = rt.coordinator.run_stage(key, stage)
        assert result.outcome == "compressed", (kind, result.detail)
        assert conversation_problems(rt.state_store, rt.log, key) == []
        _window_fits(rt, key)
    assert all(len(v) == len(FAULTS) for v in seen.values()) and len(seen) == len(MODEL_STAGES)


@pytest.fixture()
def worker_rt(db_url: str, server: OpenAIServer) -> Iterator[Runtime]:
    from tests.workers_fixture import in_process_worker

    settings = _settings(
        db_url,
        server.base_url,
        circuit_failure_threshold=3,
        circuit_reset_seconds=2.0,
        failure_backoff_seconds=0.5,
        failure_backoff_max_seconds=1.0,
    )
    # Results are never read here; without them nothing subscribes to this test's private
    # Redis, which is gone once the test ends.
    with in_process_worker(settings, ignore_result=True) as rt:
        yield rt


def _compact(rt: Runtime, key: ConversationKey, timeout: float = 30.0) -> None:
    from workers.tasks import request_compaction

    request_compaction(key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rt.scheduler.status(key) == "idle":
            return
        time.sleep(0.05)
    raise AssertionError(f"{key} still {rt.scheduler.status(key)} after {timeout}s")


@pytest.mark.slow
def test_worker_counts_failures_by_kind_retries_and_the_circuit_opens(
    worker_rt: Runtime, server: OpenAIServer
) -> None:
    rt = worker_rt
    expected_kinds = {
        "rate_limit": "rate_limit",
        "server_error": "server_unstable",
        "timeout": "timeout",
        "overflow": "context_overflow",
        "invalid_json": "unknown",
        "empty": "unknown",
    }
    for n, (fault, kind) in enumerate(expected_kinds.items()):
        key = ConversationKey("tenant-w", f"fault-{fault}")
        _fill(rt, key, rounds=4, seed=10 + n)
        before = stage_metrics().value("ctxcore_failures_total", kind=kind)
        server.push_fault(fault, retry_after=1)
        _compact(rt, key)
        after = stage_metrics().value("ctxcore_failures_total", kind=kind)
        assert after == before + 1, (fault, kind, after)
        assert rt.coordinator.plan(key) is None, fault  # compacted in the end
        assert conversation_problems(rt.state_store, rt.log, key) == []
        _window_fits(rt, key)
    # Wrong block ids: the answer is unusable, the stage is skipped (not failed) and the
    # pipeline escalates; the conversation still ends within its target.
    key = ConversationKey("tenant-w", "fault-wrong-ids")
    _fill(rt, key, rounds=4, seed=30)
    skipped_l1 = {"stage": "l0_to_l1", "outcome": "skipped"}
    skipped = stage_metrics().value("ctxcore_stage_seconds_count", **skipped_l1)
    server.push_fault("wrong_block_ids")
    _compact(rt, key)
    assert rt.coordinator.plan(key) is None
    assert stage_metrics().value("ctxcore_stage_seconds_count", **skipped_l1) == skipped + 1
    assert conversation_problems(rt.state_store, rt.log, key) == []

    # The circuit: three 5xx in a row open it (threshold 3 in this test); the stage's last
    # retry is refused without reaching the endpoint; after 2 s one probe closes it again.
    key = ConversationKey("tenant-c", "circuit")
    _fill(rt, key, rounds=4, seed=40)
    for _ in range(3):
        server.push_fault("server_error")
    calls = server.request_count
    _compact(rt, key)
    assert server.request_count == calls + 3
    assert stage_metrics().value("ctxcore_circuit_open_total") >= 1
    assert rt.circuit.state("tenant-c", server.base_url) == "open"
    assert rt.coordinator.plan(key) is not None  # gave up for now: nothing saved
    _window_fits(rt, key)
    # Another tenant on the same endpoint has its own circuit.
    assert rt.circuit.state("tenant-w", server.base_url) == "closed"
    time.sleep(2.1)
    _compact(rt, key)
    assert rt.circuit.state("tenant-c", server.base_url) == "closed"
    assert rt.coordinator.plan(key) is None
    assert conversation_problems(rt.state_store, rt.log, key) == []
