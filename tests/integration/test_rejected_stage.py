"""A stage task whose result is ``rejected`` (invalid summary) fails for good at once.

``invalid_summary`` is deterministic (the same view gives the same invalid summary), so the
task ends as Celery ``FAILURE`` without a retry; ``on_failure`` records ``last_error`` (the
API shows ``failing``), only that stage is exhausted and planning moves on, so the job
finishes and the next window is served.

Runs the real drain and stage tasks in-process (``Task.apply``) over a real Redis (lock,
lease, scheduler, stores, failure record); only the hand-off of each next stage is recorded
instead of sent to the broker, then applied in turn.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.coordinator import INVALID_SUMMARY
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey, SummaryBlock

pytestmark = pytest.mark.redis


class OrphanSummarizer:
    def __call__(
        self, previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None:
        return [
            UserMessage(content="summary"),
            AssistantMessage(content=None, tool_calls=[ToolCall(id="call-1", name="f")]),
            ToolMessage(content="r", tool_call_id="other"),
        ]


@pytest.fixture()
def configured(redis_url: str, redis_prefix: str) -> Iterator[Any]:
    from workers import app as app_module

    saved = (app_module._state.settings, app_module._state.runtime)
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": redis_prefix},
            "worker": {"retry_delays": [0.1, 0.2]},
            "engine": {"keep_recent_messages": 0},
        }
    )
    app_module.configure(settings)
    rt = app_module.runtime()
    yield rt
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"*{redis_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    rt.redis.close()
    app_module._state.settings, app_module._state.runtime = saved


def test_a_rejected_stage_fails_without_retry_shows_failing_and_planning_moves_on(
    configured: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxcore.window import check_window
    from workers import jobs, tasks
    from workers.failures import StageFailedError
    from workers.runtime import build_service

    rt = configured
    key = ConversationKey("acme", f"rej-{uuid.uuid4().hex[:6]}")
    for i in range(0, 40, 2):
        rt.log.append(
            key,
            [
                UserMessage(content=f"question {i} " + "words " * 40),
                AssistantMessage(content=f"answer {i} " + "more words " * 40),
            ],
        )
    rt.state_store.set_budget(key, 1500)
    rt.coordinator.summarizer = OrphanSummarizer()
    sent: list[tuple[str, dict[str, Any], list[str]]] = []
    monkeypatch.setattr(
        jobs,
        "send_stage",
        lambda k, stage, exhausted: sent.append((stage.kind, stage.model_dump(mode="json"), list(exhausted))),
    )
    assert rt.scheduler.request(key)
    started = tasks.drain.apply()
    assert started.state == "SUCCESS" and started.result["stage"] == "l0_to_l1", started.traceback
    assert rt.scheduler.status(key) == "running"

    kind, stage, exhausted = sent.pop(0)
    outcome = tasks.STAGE_TASKS[kind].apply(args=[key.tenant_id, key.conversation_id, stage, exhausted])

    assert outcome.state == "FAILURE", outcome.traceback
    assert isinstance(outcome.result, StageFailedError) and outcome.result.kind == INVALID_SUMMARY
    assert "orphan_tool_result" in outcome.result.message
    assert rt.state_store.load(key) is None  # the rejected summary was never saved
    last_error = rt.failures.detail(key).last_error
    assert last_error is not None and last_error.kind == INVALID_SUMMARY and last_error.stage == "l0_to_l1"
    # No retry (that would resend l0_to_l1): only this stage is exhausted, planning moved on.
    assert sent and sent[0][0] != "l0_to_l1" and sent[0][2] == ["l0_to_l1"]

    while sent:  # the rest of the job, stage by stage, until planning ends
        kind, stage, exhausted = sent.pop(0)
        done = tasks.STAGE_TASKS[kind].apply(args=[key.tenant_id, key.conversation_id, stage, exhausted])
        assert done.state == "SUCCESS", done.traceback
    assert rt.scheduler.status(key) == "idle"  # the job finished

    window = build_service(rt, tasks.CeleryQueue()).get_window(key, 1500)
    assert window.compaction == "failing"  # until a later job succeeds
    detail = window.compaction_detail.last_error
    assert detail is not None and detail.kind == INVALID_SUMMARY
    assert window.messages and check_window(window.messages) == []
    assert window.stats.total_tokens <= 1500
