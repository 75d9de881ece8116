"""Every stage run of a compaction job is journaled (``workers.tasks`` -> ``ctxcore.state.journal``):
compressed and skipped stages, a rejected one with its error, each with its tokens, summariser
calls, duration and the version it saved.

Runs the real drain and stage tasks in-process (``Task.apply``) over a real Redis, as
``test_rejected_stage`` does: each next stage is recorded instead of sent, then applied.
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

SECRET = "sk-live0123456789abcdefghijklmnop"


class OrphanSummarizer:
    """A summary that would break the chat protocol (rejected), naming a secret in its text."""

    def __call__(
        self, previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None:
        return [
            UserMessage(content="summary"),
            AssistantMessage(content=None, tool_calls=[ToolCall(id="call-1", name="f")]),
            ToolMessage(content=SECRET, tool_call_id="other"),
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


def _conversation(rt: Any, name: str) -> ConversationKey:
    key = ConversationKey("acme", f"{name}-{uuid.uuid4().hex[:6]}")
    for i in range(0, 40, 2):
        rt.log.append(
            key,
            [
                UserMessage(content=f"question {i} " + "words " * 40),
                AssistantMessage(content=f"answer {i} " + "more words " * 40),
            ],
        )
    rt.state_store.set_budget(key, 1500)
    return key


def _run_job(rt: Any, key: ConversationKey, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Drain the job and apply its stages one by one; (stage, Celery state) of each."""
    from workers import jobs, tasks

    sent: list[tuple[str, dict[str, Any], list[str]]] = []
    monkeypatch.setattr(
        jobs,
        "send_stage",
        lambda k, stage, exhausted: sent.append((stage.kind, stage.model_dump(mode="json"), list(exhausted))),
    )
    assert rt.scheduler.request(key)
    assert tasks.drain.apply().state == "SUCCESS"
    ran = []
    while sent:
        kind, stage, exhausted = sent.pop(0)
        done = tasks.STAGE_TASKS[kind].apply(args=[key.tenant_id, key.conversation_id, stage, exhausted])
        ran.append((kind, done.state))
    assert rt.scheduler.status(key) == "idle"
    return ran


def test_a_job_journals_every_stage_it_ran(configured: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = configured
    key = _conversation(rt, "journal")
    ran = _run_job(rt, key, monkeypatch)
    entries = rt.journal.entries(key)
    assert [e.stage for e in reversed(entries)] == [kind for kind, _ in ran]  # one entry per run, in order
    compressed = [e for e in entries if e.outcome == "compressed"]
    assert compressed, [(e.stage, e.outcome) for e in entries]
    state = rt.state_store.load(key)
    assert state is not None and entries[0].version in (state.version, None)
    assert compressed[0].version == max(e.version for e in compressed) == state.version
    for entry in compressed:
        assert entry.tokens_before is not None and entry.tokens_after is not None
        assert entry.tokens_after < entry.tokens_before
        assert entry.duration_ms > 0 and entry.error_kind is None
    assert all(e.version is None for e in entries if e.outcome != "compressed")
    assert all(e.detail for e in entries if e.outcome == "skipped")
    assert sum(e.model_calls for e in entries) >= 1  # the offline model's calls are counted


def test_a_rejected_stage_is_journaled_with_its_redacted_error(
    configured: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = configured
    key = _conversation(rt, "rejected")
    rt.coordinator.summarizer = OrphanSummarizer()
    ran = _run_job(rt, key, monkeypatch)
    assert ran[0] == ("l0_to_l1", "FAILURE")
    oldest = rt.journal.entries(key)[-1]
    assert (oldest.stage, oldest.outcome, oldest.error_kind) == ("l0_to_l1", "rejected", INVALID_SUMMARY)
    assert oldest.error_message and "orphan_tool_result" in oldest.error_message
    assert SECRET not in oldest.error_message and oldest.version is None
    assert len(rt.journal.entries(key)) == len(ran)  # on_failure adds no second entry
