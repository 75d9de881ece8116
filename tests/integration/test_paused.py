"""A job that cannot progress pauses its conversation; windows start no job until it re-arms.

The futile case of issue 34, from the code paths that end in ``skipped``: every summary the
model returns is no smaller than what it replaces (``_apply`` in ``ctxcore.pipeline.running``
keeps only summaries smaller than their source: "no summary was usable"), so L0->L1 and both
aggressive stages end ``skipped``; the view has no blocks, so hard truncate has nothing to
cut and planning ends the job. Before, the job counted as a success and every window over
the trigger ran it again (3 summariser calls a window, the state at version 0).

Runs the real drain and stage tasks in-process (``Task.apply``) over a real Redis; the
hand-off of each next stage and each drain token is recorded instead of sent to a broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage, message_text
from ctxcore.state import ConversationKey
from ctxcore.summarize.model import Completion, OutputContract, Usage

pytestmark = pytest.mark.redis
BUDGET = 1500


@dataclass
class BloatingModel:
    """A model whose every summary is longer than its prompt (a small local model that
    repeats itself): no summary is ever usable."""

    calls: int = 0
    input_tokens: int = 0
    name: str = "bloating"

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.calls += 1
        prompt = "\n".join(message_text(m) for m in messages)
        self.input_tokens += len(prompt) // 4
        return Completion(prompt + "\n" + prompt, Usage(len(prompt) // 4, len(prompt) // 2, 0, 1, self.name))


@dataclass
class Harness:
    rt: Any
    key: ConversationKey
    model: BloatingModel
    tokens: list[int | None] = field(default_factory=list)
    stages: list[tuple[str, dict[str, Any], list[str]]] = field(default_factory=list)

    def window(self, budget: int = BUDGET) -> Any:
        from workers import tasks
        from workers.runtime import build_service

        return build_service(self.rt, tasks.CeleryQueue()).get_window(self.key, budget)

    def run_jobs(self) -> list[dict[str, Any]]:
        """Apply every recorded drain token and the stages they lead to; the results."""
        from workers import tasks

        results = []
        while self.tokens:
            ring = self.tokens.pop(0)
            started = tasks.drain.apply(kwargs={} if ring is None else {"ring": ring})
            assert started.state == "SUCCESS", started.traceback
            results.append(started.result)
            while self.stages:
                kind, stage, exhausted = self.stages.pop(0)
                done = tasks.STAGE_TASKS[kind].apply(
                    args=[self.key.tenant_id, self.key.conversation_id, stage, exhausted]
                )
                assert done.state == "SUCCESS", done.traceback
                results.append(done.result)
        return results


@pytest.fixture()
def harness(redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    from workers import app as app_module
    from workers import jobs
    from workers import runtime as runtime_module

    saved = (app_module._state.settings, app_module._state.runtime)
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": redis_prefix},
            "worker": {"retry_delays": [0.1]},
            "engine": {"keep_recent_messages": 2},
        }
    )
    app_module.configure(settings)
    rt = app_module.runtime()
    model = BloatingModel()
    # The runtime's own wrapping (the tenant's daily budget) around this model.
    monkeypatch.setattr(runtime_module, "build_model", lambda cfg, counter: model)
    h = Harness(rt, ConversationKey("acme", f"futile-{uuid.uuid4().hex[:6]}"), model)

    def record_tokens(count: int = 1, ring: int | None = None) -> int:
        h.tokens.extend([ring] * count)
        return count

    monkeypatch.setattr(jobs, "send_drain_tokens", record_tokens)
    monkeypatch.setattr(
        jobs,
        "send_stage",
        lambda k, stage, exhausted: h.stages.append(
            (stage.kind, stage.model_dump(mode="json"), list(exhausted))
        ),
    )
    yield h
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"*{redis_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    rt.redis.close()
    app_module._state.settings, app_module._state.runtime = saved


def dialogue(rounds: int, start: int = 0) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(start, start + rounds):
        out += [
            UserMessage(content=f"question {i} about the parser " + "words " * 30),
            AssistantMessage(content=f"answer {i}: the parser handles it " + "more words " * 30),
        ]
    return out


def test_a_futile_job_pauses_and_20_windows_cost_no_call_until_the_log_grows(harness: Harness) -> None:
    h = harness
    h.rt.log.append(h.key, dialogue(20))

    first = h.window()
    assert first.compaction == "queued" and h.tokens == [h.rt.scheduler.ring_of("acme")]
    results = h.run_jobs()
    # The incident's sequence: three model stages, each skipped, nothing saved.
    ran = [r["stage"] for r in results[1:]]
    assert ran == ["l0_to_l1", "aggressive_keep_recent", "aggressive_full_context"]
    assert all(r["outcome"] == "skipped" for r in results[1:])
    assert results[-1]["hold"] == "no_progress"  # the stopped job's result names it (Flower)
    assert h.model.calls == 3 and h.rt.state_store.load(h.key) is None

    paused = h.window()
    assert paused.compaction == "paused"
    hold = paused.compaction_detail.hold
    assert paused.compaction_detail.reason == "no_progress" and hold is not None
    assert hold.view_tokens > hold.target_tokens == int(BUDGET * 0.8) and hold.budget_tokens == BUDGET
    assert 0 < hold.held_tokens < hold.target_tokens
    assert "saved nothing" in hold.why and "no summary was usable" in hold.why
    assert paused.stats.total_tokens <= BUDGET  # served by the rules and the fallback

    for _ in range(19):  # 20 windows after the futile job, counting the one above
        assert h.window().compaction == "paused"
    assert h.tokens == [] and h.run_jobs() == []
    assert h.model.calls == 3 and h.rt.scheduler.status(h.key) == "idle"

    # A step smaller than 5% of the budget does not re-arm it.
    h.rt.log.append(h.key, [UserMessage(content="ok?"), AssistantMessage(content="ok.")])
    assert h.window().compaction == "paused" and h.tokens == []

    # One more step of over 5% of the budget: the 21st window starts one job.
    h.rt.log.append(h.key, dialogue(1, start=20))
    assert h.window().compaction == "queued" and len(h.tokens) == 1
    h.run_jobs()
    assert h.model.calls == 6
    again = h.window()
    assert again.compaction == "paused" and again.compaction_detail.hold is not None
    assert again.compaction_detail.hold.last_id == h.rt.log.last_id(h.key)


def test_a_changed_budget_or_the_backoff_re_arms_a_paused_conversation(harness: Harness) -> None:
    h = harness
    h.rt.log.append(h.key, dialogue(20))
    h.window()
    h.run_jobs()
    assert h.window().compaction == "paused" and h.tokens == []

    assert h.window(BUDGET + 100).compaction == "queued" and len(h.tokens) == 1
    h.run_jobs()
    assert h.window(BUDGET + 100).compaction == "paused"

    h.rt.settings.worker.__dict__["no_progress_backoff_seconds"] = 0.3
    time.sleep(0.4)
    assert h.window(BUDGET + 100).compaction == "queued"


def test_a_view_held_over_target_by_its_newest_step_is_idle_with_the_reason(harness: Harness) -> None:
    h = harness
    h.rt.log.append(h.key, dialogue(2))
    h.rt.log.append(
        h.key,
        [
            UserMessage(content="write the whole report"),
            AssistantMessage(content="The report: " + "a long finding about the parser " * 260),
        ],
    )
    assert h.window().compaction == "queued"
    results = h.run_jobs()
    assert results[-1]["hold"] == "newest_step"
    calls = h.model.calls  # the stages tried the older steps (no summary was usable)

    held = h.window()
    assert held.compaction == "idle" and held.compaction_detail.reason == "newest_step"
    hold = held.compaction_detail.hold
    assert hold is not None and hold.held_tokens > hold.target_tokens
    assert "newest step" in hold.why
    for _ in range(5):
        assert h.window().compaction == "idle"
    assert h.tokens == [] and h.model.calls == calls

    h.rt.log.append(h.key, dialogue(1, start=5))  # a new step: the old newest is summarisable
    assert h.window().compaction == "queued"


def test_paused_is_public_in_the_http_api_the_openapi_document_and_ctxcore_inspect(
    harness: Harness, redis_url: str, redis_prefix: str
) -> None:
    import json

    from fastapi.testclient import TestClient

    from ctxcore.config import hash_token
    from tests.integration.test_cli import run_cli
    from workers.http import create_app
    from workers.tasks import CeleryQueue

    h = harness
    h.rt.log.append(h.key, dialogue(20))
    h.window()
    h.run_jobs()
    token = "paused-token"
    h.rt.settings.http.__dict__["tokens"] = {hash_token(token): h.key.tenant_id}
    client = TestClient(create_app(h.rt, CeleryQueue()))
    auth = {"Authorization": f"Bearer {token}"}
    conv = f"/v1/conversations/{h.key.conversation_id}"

    window = client.post(f"{conv}/window", json={"budget_tokens": BUDGET}, headers=auth).json()
    assert window["compaction"] == "paused" and window["compaction_detail"]["reason"] == "no_progress"
    hold = window["compaction_detail"]["hold"]
    assert hold["view_tokens"] > hold["target_tokens"] and "saved nothing" in hold["why"]
    state = client.get(f"{conv}/state", headers=auth).json()
    assert state["compaction"] == "paused" and state["compaction_detail"]["reason"] == "no_progress"

    doc = client.get("/openapi.json").json()
    status = doc["components"]["schemas"]["WindowResponse"]["properties"]["compaction"]
    assert "paused" in json.dumps(status) and "unknown" not in status.get("enum", [])
    assert {"reason", "hold"} <= set(doc["components"]["schemas"]["CompactionDetailOut"]["properties"])

    code, out = run_cli(
        "inspect",
        h.key.tenant_id,
        h.key.conversation_id,
        "--json",
        env={"CTXCORE_REDIS_URL": redis_url, "CTXCORE_REDIS__KEY_PREFIX": redis_prefix},
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["compaction"] == "paused" and doc["compaction_detail"]["reason"] == "no_progress"
    assert doc["compaction_detail"]["hold"]["target_tokens"] == int(BUDGET * 0.8)
