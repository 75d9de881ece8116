"""A stage task whose result is ``rejected`` (invalid summary): no retry, the stage is exhausted.

Runs the real stage task in-process (``Task.apply``) over a real Redis (lock, lease, stores);
only the hand-off to the next stage is recorded instead of sent to the broker.
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

    saved = dict(app_module._state)
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
    app_module._state.clear()
    app_module._state.update(saved)


def test_a_rejected_stage_is_not_retried_and_planning_moves_on(
    configured: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import tasks

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
    handed_on: list[list[str]] = []
    monkeypatch.setattr(tasks, "_plan_and_send", lambda k, exhausted: handed_on.append(exhausted) or None)
    stage = rt.coordinator.plan(key)
    assert stage is not None and stage.kind == "l0_to_l1"

    outcome = tasks.STAGE_TASKS["l0_to_l1"].apply(
        args=[key.tenant_id, key.conversation_id, stage.model_dump(mode="json"), []]
    )

    assert outcome.state == "SUCCESS", outcome.traceback  # issue 13 maps this to FAILURE
    summary = outcome.result
    assert summary["outcome"] == "rejected" and summary["error_kind"] == INVALID_SUMMARY
    assert handed_on == [["l0_to_l1"]]  # exhausted at once: no retry of a deterministic failure
    assert rt.state_store.load(key) is None
