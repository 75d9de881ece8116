"""Each tenant's summariser tokens per UTC day are reserved before each call and capped.

Real drain and stage tasks in-process (``Task.apply``) over a real Redis, the runtime's own
model wrapping (``workers.spend.BudgetedModel`` around the offline ``ExtractiveModel``); the
hand-off of each next stage and each drain token is recorded instead of sent to a broker.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from ctxcore.config import Settings, hash_token
from ctxcore.errors import ConfigError, StoreUnavailable
from ctxcore.messages import AnyMessage
from ctxcore.state import ConversationKey
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, OutputContract
from tests.integration.test_paused import BUDGET, dialogue
from workers.spend import summariser_cap

pytestmark = pytest.mark.redis
TOKEN = "budget-token"


class CountingModel:
    """The offline ``ExtractiveModel``, counting its calls and the most a call reserves."""

    def __init__(self, model: ExtractiveModel, counter: Any) -> None:
        self.model = model
        self.counter = counter
        self.calls = 0
        self.largest_reservation = 0
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.model.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        with self._lock:
            self.calls += 1
            reserved = self.counter.count_messages(list(messages)) + max_tokens
            self.largest_reservation = max(self.largest_reservation, reserved)
        return self.model.complete(messages, max_tokens=max_tokens, contract=contract)


@dataclass
class Deployment:
    rt: Any
    model: CountingModel
    tokens: list[int | None] = field(default_factory=list)
    stages: list[tuple[ConversationKey, str, dict[str, Any], list[str]]] = field(default_factory=list)

    def window(self, key: ConversationKey, budget: int = BUDGET) -> Any:
        from workers import tasks
        from workers.runtime import build_service

        return build_service(self.rt, tasks.CeleryQueue()).get_window(key, budget)

    def run_jobs(self) -> list[dict[str, Any]]:
        from workers import tasks

        results = []
        while self.tokens:
            ring = self.tokens.pop(0)
            started = tasks.drain.apply(kwargs={} if ring is None else {"ring": ring})
            assert started.state == "SUCCESS", started.traceback
            results.append(started.result)
            while self.stages:
                key, kind, stage, exhausted = self.stages.pop(0)
                done = tasks.STAGE_TASKS[kind].apply(
                    args=[key.tenant_id, key.conversation_id, stage, exhausted]
                )
                assert done.state == "SUCCESS", done.traceback
                results.append(done.result)
        return results

    def day_tokens(self, tenant: str, day: str) -> int:
        return int(self.rt.redis.get(self.rt.spend.key(tenant, day)) or 0)


@pytest.fixture()
def deploy(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[dict[str, Any]], Deployment]]:
    from workers import app as app_module
    from workers import jobs
    from workers import runtime as runtime_module

    saved = (app_module._state.settings, app_module._state.runtime)
    made: list[Deployment] = []

    def make(tenants: dict[str, Any]) -> Deployment:
        settings = Settings.load(
            {
                "redis": {"url": redis_url, "key_prefix": redis_prefix},
                "worker": {"retry_delays": [0.1]},
                "engine": {"keep_recent_messages": 2},
                "http": {"tokens": {hash_token(TOKEN): "acme"}},
                "tenants": tenants,
            }
        )
        app_module.configure(settings)
        rt = app_module.runtime()
        model = CountingModel(ExtractiveModel(rt.counter), rt.counter)
        monkeypatch.setattr(runtime_module, "build_model", lambda cfg, counter: model)
        d = Deployment(rt, model)

        def record_tokens(count: int = 1, ring: int | None = None) -> int:
            d.tokens.extend([ring] * count)
            return count

        monkeypatch.setattr(jobs, "send_drain_tokens", record_tokens)
        monkeypatch.setattr(
            jobs,
            "send_stage",
            lambda k, stage, exhausted: d.stages.append(
                (k, stage.kind, stage.model_dump(mode="json"), list(exhausted))
            ),
        )
        made.append(d)
        return d

    yield make
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"*{redis_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    for d in made:
        d.rt.redis.close()
    app_module._state.settings, app_module._state.runtime = saved


def conversation(d: Deployment, tenant: str = "acme") -> ConversationKey:
    key = ConversationKey(tenant, f"spend-{uuid.uuid4().hex[:8]}")
    d.rt.log.append(key, dialogue(20))
    d.rt.state_store.set_budget(key, BUDGET)
    return key


def one_call(deploy: Callable[[dict[str, Any]], Deployment]) -> int:
    """The most one l0_to_l1 call of a ``dialogue(20)`` conversation reserves (no cap)."""
    d = deploy({})
    key = conversation(d, "probe")
    assert d.window(key).compaction == "queued"
    d.run_jobs()
    assert d.model.calls >= 1
    return d.model.largest_reservation


def test_eight_stages_racing_at_the_cap_overshoot_it_by_at_most_one_call(
    deploy: Callable[[dict[str, Any]], Deployment],
) -> None:
    from workers import tasks

    call = one_call(deploy)
    cap = int(call * 3.5)
    d = deploy({"acme": {"summariser_tokens_per_day": cap}})
    keys = [conversation(d) for _ in range(8)]
    planned = [d.rt.coordinator.plan(k) for k in keys]
    assert all(p is not None and p.kind == "l0_to_l1" for p in planned)
    for k in keys:
        assert d.rt.scheduler.request(k)
        d.rt.failures.job_started(k)
    barrier = threading.Barrier(8)
    results: list[Any] = [None] * 8

    def run(i: int) -> None:
        stage = planned[i]
        assert stage is not None
        barrier.wait()
        results[i] = tasks.STAGE_TASKS["l0_to_l1"].apply(
            args=[keys[i].tenant_id, keys[i].conversation_id, stage.model_dump(mode="json"), []]
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None and r.state == "SUCCESS" for r in results), [r.traceback for r in results if r]
    outcomes = [r.result["outcome"] for r in results]
    paused = outcomes.count("paused")
    assert paused >= 1 and outcomes.count("compressed") == 8 - paused
    # Only the stages that got a reservation called the model.
    assert d.model.calls == 8 - paused
    today = datetime.now(UTC).date().isoformat()
    used = d.day_tokens("acme", today)
    assert used <= cap + call  # overshoot at most one call (here none: reservations are upper bounds)
    for k, outcome in zip(keys, outcomes, strict=True):
        hold = d.rt.failures.get(k).hold
        if outcome == "paused":
            assert hold is not None and hold.reason == "budget_exhausted" and hold.cap_tokens == cap
            assert hold.needed_tokens and hold.used_tokens is not None and hold.day == today
        else:
            assert hold is None


def test_a_tenant_at_its_cap_is_paused_everywhere_and_the_next_utc_day_resumes_it(
    deploy: Callable[[dict[str, Any]], Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from workers import spend
    from workers.http import create_app
    from workers.prom_worker import stage_metrics
    from workers.tasks import CeleryQueue

    call = one_call(deploy)
    cap = int(call * 1.5)
    d = deploy({"acme": {"summariser_tokens_per_day": cap}})
    first, second = conversation(d), conversation(d)
    tokens_before = stage_metrics().value("ctxcore_summariser_tokens_total", tenant="acme")
    paused_before = stage_metrics().value("ctxcore_compaction_paused_total", reason="budget_exhausted")

    assert d.window(first).compaction == "queued"
    d.run_jobs()
    calls = d.model.calls
    assert calls >= 1 and d.rt.state_store.load(first) is not None
    assert d.window(second).compaction == "queued"
    results = d.run_jobs()
    assert d.model.calls == calls  # at the cap: no further call
    assert {"outcome": "paused", "hold": "budget_exhausted"}.items() <= results[1].items()

    window = d.window(second)
    assert window.compaction == "paused" and window.compaction_detail.reason == "budget_exhausted"
    assert window.stats.total_tokens <= BUDGET  # served by the rules and the fallback
    hold = window.compaction_detail.hold
    assert hold is not None and hold.cap_tokens == cap and hold.needed_tokens is not None
    assert hold.used_tokens is not None and hold.used_tokens + hold.needed_tokens > cap
    for _ in range(5):
        assert d.window(second).compaction == "paused"
    assert d.tokens == []

    client = TestClient(create_app(d.rt, CeleryQueue()))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    state = client.get(f"/v1/conversations/{second.conversation_id}/state", headers=auth).json()
    assert state["compaction"] == "paused"
    assert state["compaction_detail"]["reason"] == "budget_exhausted"
    usage = client.get("/v1/usage", headers=auth).json()
    today = datetime.now(UTC).date().isoformat()
    assert usage["day"] == today and usage["summariser_tokens_per_day"] == cap
    assert 0 < usage["summariser_tokens_today"] == d.day_tokens("acme", today) <= cap
    spent = stage_metrics().value("ctxcore_summariser_tokens_total", tenant="acme") - tokens_before
    assert spent == usage["summariser_tokens_today"]
    assert (
        stage_metrics().value("ctxcore_compaction_paused_total", reason="budget_exhausted")
        == paused_before + 1
    )

    from tests.integration.test_cli import run_cli

    code, out = run_cli(
        "inspect",
        "acme",
        second.conversation_id,
        "--json",
        env={
            "CTXCORE_REDIS_URL": d.rt.settings.redis.url,
            "CTXCORE_REDIS__KEY_PREFIX": d.rt.settings.redis.key_prefix,
            "CTXCORE_TENANTS": json.dumps({"acme": {"summariser_tokens_per_day": cap}}),
        },
    )
    assert code == 0, out
    doc = json.loads(out)
    assert doc["compaction"] == "paused" and doc["compaction_detail"]["reason"] == "budget_exhausted"

    tomorrow = datetime.now(UTC) + timedelta(days=1)
    monkeypatch.setattr(spend, "utc_now", lambda: tomorrow)
    assert d.window(second).compaction == "queued"
    d.run_jobs()
    assert d.model.calls > calls and d.rt.state_store.load(second) is not None
    assert d.day_tokens("acme", tomorrow.date().isoformat()) > 0
    assert d.window(second).compaction_detail.hold is None


def test_cap_zero_runs_the_tenant_on_the_rules_alone(deploy: Callable[[dict[str, Any]], Deployment]) -> None:
    from fastapi.testclient import TestClient

    from workers.http import create_app
    from workers.tasks import CeleryQueue

    d = deploy({"acme": {"summariser_tokens_per_day": 0}})
    key = conversation(d)
    for _ in range(5):
        window = d.window(key)
        assert window.compaction == "idle" and window.compaction_detail.hold is None
        assert window.stats.total_tokens <= BUDGET
    client = TestClient(create_app(d.rt, CeleryQueue()))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    compact = client.post(f"/v1/conversations/{key.conversation_id}/compact", headers=auth)
    assert compact.status_code == 202 and compact.json() == {"status": "idle"}
    assert d.tokens == [] and d.model.calls == 0
    assert client.get("/v1/usage", headers=auth).json()["summariser_tokens_per_day"] == 0


def test_a_reservation_larger_than_the_whole_cap_pauses_at_once(
    deploy: Callable[[dict[str, Any]], Deployment],
) -> None:
    d = deploy({"acme": {"summariser_tokens_per_day": 50}})
    key = conversation(d)
    assert d.window(key).compaction == "queued"
    d.run_jobs()
    assert d.model.calls == 0
    hold = d.window(key).compaction_detail.hold
    assert hold is not None and hold.reason == "budget_exhausted"
    assert hold.cap_tokens == 50 and hold.needed_tokens is not None and hold.needed_tokens > 50
    assert "more than the whole cap" in hold.why
    assert hold.view_tokens > hold.target_tokens  # the sizes


def test_redis_unreachable_at_reservation_fails_the_stage_visibly_without_a_call(
    deploy: Callable[[dict[str, Any]], Deployment], caplog: pytest.LogCaptureFixture
) -> None:
    from workers import tasks

    d = deploy({"acme": {"summariser_tokens_per_day": 10**9}})
    key = conversation(d)
    stage = d.rt.coordinator.plan(key)
    assert stage is not None and d.rt.scheduler.request(key)
    d.rt.failures.job_started(key)

    def unreachable(**_: Any) -> Any:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    d.rt.spend._reserve = unreachable
    args = [key.tenant_id, key.conversation_id, stage.model_dump(mode="json"), []]
    with caplog.at_level(logging.WARNING, logger="workers.tasks"):
        # Eagerly applied, the task's retry (worker.retry_delays: one) runs inline.
        failed = tasks.STAGE_TASKS[stage.kind].apply(args=args)
    assert failed.state == "FAILURE" and isinstance(failed.result, StoreUnavailable)
    assert any(
        "kind=store_unavailable" in r.getMessage() and "retry in" in r.getMessage() for r in caplog.records
    )
    assert d.model.calls == 0 and d.rt.state_store.load(key) is None
    error = d.rt.failures.detail(key).last_error
    assert error is not None and error.kind == "store_unavailable" and "not called" in error.message
    assert d.window(key).compaction == "failing"


def test_a_call_is_counted_on_the_day_it_reserved(
    deploy: Callable[[dict[str, Any]], Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import spend

    d = deploy({})
    before = datetime(2026, 12, 2, 23, 59, 59, tzinfo=UTC)
    monkeypatch.setattr(spend, "utc_now", lambda: before)
    reservation = d.rt.spend.reserve("acme", 500, 1000)
    monkeypatch.setattr(spend, "utc_now", lambda: before + timedelta(seconds=2))
    d.rt.spend.settle(reservation, 420)
    assert d.day_tokens("acme", "2026-12-02") == 420 and d.day_tokens("acme", "2026-12-03") == 0
    assert d.rt.spend.used("acme") == ("2026-12-03", 0)


def test_a_negative_cap_is_refused_naming_the_setting_and_the_default_applies() -> None:
    with pytest.raises(ConfigError, match=r"service\.summariser_tokens_per_day"):
        Settings.load({"service": {"summariser_tokens_per_day": -1}})
    with pytest.raises(ConfigError, match=r"tenants\.acme\.summariser_tokens_per_day"):
        Settings.load({"tenants": {"acme": {"summariser_tokens_per_day": -5}}})
    settings = Settings.load(
        {
            "service": {"summariser_tokens_per_day": 9000},
            "tenants": {"acme": {"summariser_tokens_per_day": 0}},
        }
    )
    assert summariser_cap(settings, "acme") == 0 and summariser_cap(settings, "other") == 9000
    assert summariser_cap(Settings.load({}), "acme") is None
