"""Traces across the scheduler, end to end: window requests in one process, the job they
queued run by a real Celery worker (no eager mode), spans in the SDK's in-memory exporter.

One trace per request and one per job: the job's span starts a trace of its own, linked to
every request that coalesced into it; each stage (and each summariser call inside it)
continues the job's trace through the stage task's headers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ctxcore.config import Settings
from ctxcore.messages import from_openai
from ctxcore.state import ConversationKey
from tests.workers_fixture import in_process_worker
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime, build_service
from workers.telemetry.otel import tracer_with
from workers.telemetry.spans import describe_window, window_span

pytestmark = pytest.mark.redis
BUDGET = 1500


def _settings(redis_url: str, prefix: str, ttl: float) -> Settings:
    return Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "worker": {"retry_delays": [0.1, 0.2, 0.4], "lock_timeout": 10},
            "engine": {"keep_recent_messages": 4},
            "telemetry": {"job_context_ttl_seconds": ttl},
        }
    )


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed_keys(client, name)
    finally:
        client.close()


@pytest.fixture()
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Every runtime of the test (the API's and the worker's) traces to this exporter."""
    spans = InMemorySpanExporter()
    tracer = tracer_with(SimpleSpanProcessor(spans))
    monkeypatch.setattr("workers.runtime.build_tracer", lambda _settings: tracer)
    return spans


def _windows(settings: Settings, key: ConversationKey, count: int) -> Runtime:
    """Append a conversation over its trigger, then ``count`` window requests (no worker
    runs yet: they all coalesce into one queued job)."""
    from workers.app import configure, runtime
    from workers.tasks import CeleryQueue

    configure(settings)
    rt = runtime()
    service = build_service(rt, CeleryQueue())
    turns = []
    for i in range(30):
        turns.append({"role": "user", "content": f"step {i}: check the parser output for case {i} " * 8})
        turns.append(
            {"role": "assistant", "content": f"case {i} parses; the tokens line up with rule {i} " * 8}
        )
    service.append(key, from_openai(turns))
    for _ in range(count):
        with window_span(rt.tracer, key, BUDGET, "api") as span:
            result = service.get_window(key, BUDGET)
            describe_window(span, result)
        assert result.compaction == "queued"
    return rt


def _run_job(settings: Settings, key: ConversationKey, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    with in_process_worker(settings) as rt:
        deadline = time.time() + 60
        while time.time() < deadline:
            done = rt.scheduler.status(key) == "idle"
            if done and any(s.name == "ctxcore.compaction.stage" for s in exporter.get_finished_spans()):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the compaction job did not finish in 60 s")
        time.sleep(0.5)  # the last stage's span ends just after the job's status
    return list(exporter.get_finished_spans())


def test_a_job_links_to_every_request_that_coalesced_into_it_and_its_stages_continue_its_trace(
    redis_url: str, prefix: str, exporter: InMemorySpanExporter
) -> None:
    settings = _settings(redis_url, prefix, ttl=3600)
    key = ConversationKey("acme", f"tr-{uuid.uuid4().hex[:6]}")
    _windows(settings, key, 3)
    spans = _run_job(settings, key, exporter)

    windows = [s for s in spans if s.name == "ctxcore.window"]
    (job,) = [s for s in spans if s.name == "ctxcore.compaction.job"]
    stages = [s for s in spans if s.name == "ctxcore.compaction.stage"]
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert len(windows) == 3 and stages and calls
    # One trace per request, one for the job, linked.
    assert len({w.context.trace_id for w in windows}) == 3
    assert job.parent is None and job.context.trace_id not in {w.context.trace_id for w in windows}
    assert [link.context.span_id for link in job.links] == [w.context.span_id for w in windows]
    job_attrs = job.attributes or {}
    assert job_attrs["ctxcore.job.requests"] == 3 and job_attrs["ctxcore.job.linked_requests"] == 3
    assert (
        job_attrs["ctxcore.tenant.id"] == "acme"
        and job_attrs["gen_ai.conversation.id"] == key.conversation_id
    )
    for w in windows:
        attrs = w.attributes or {}
        assert (
            attrs["ctxcore.window.budget_tokens"] == BUDGET and attrs["ctxcore.compaction.status"] == "queued"
        )
        assert 0 < int(str(attrs["ctxcore.window.tokens_served"])) <= BUDGET
        assert "ctxcore.window.fallback_applied" in attrs
    # Every stage is a child of the job's span, in other tasks than the drain's.
    assert all(s.context.trace_id == job.context.trace_id for s in stages)
    assert all(s.parent is not None and s.parent.span_id == job.context.span_id for s in stages)
    stage_ids = {s.context.span_id for s in stages}
    for stage in stages:
        attrs = stage.attributes or {}
        assert {"ctxcore.stage.kind", "ctxcore.stage.outcome", "ctxcore.stage.duration_ms"} <= set(attrs)
        assert int(str(attrs["ctxcore.stage.tokens_before"])) >= int(str(attrs["ctxcore.stage.tokens_after"]))
    compressed = [s for s in stages if (s.attributes or {})["ctxcore.stage.outcome"] == "compressed"]
    assert compressed and int(str((compressed[0].attributes or {})["ctxcore.stage.tokens_before"])) > int(
        str((compressed[0].attributes or {})["ctxcore.stage.tokens_after"])
    )
    # Each summariser call is a GenAI span under its stage, with its tokens.
    for call in calls:
        attrs = call.attributes or {}
        assert call.parent is not None and call.parent.span_id in stage_ids
        assert int(str(attrs["gen_ai.usage.input_tokens"])) > 0 and "gen_ai.request.model" in attrs
    by_stage = {s.context.span_id: s for s in stages}
    for span_id, stage in by_stage.items():
        mine = [c for c in calls if c.parent is not None and c.parent.span_id == span_id]
        attrs = stage.attributes or {}
        assert attrs["ctxcore.stage.summariser_calls"] == len(mine)
        assert attrs["ctxcore.stage.summariser_input_tokens"] == sum(
            int(str((c.attributes or {})["gen_ai.usage.input_tokens"])) for c in mine
        )


def test_a_job_whose_queuing_context_expired_starts_its_own_trace(
    redis_url: str, prefix: str, exporter: InMemorySpanExporter
) -> None:
    settings = _settings(redis_url, prefix, ttl=0.5)
    key = ConversationKey("acme", f"tr-{uuid.uuid4().hex[:6]}")
    _windows(settings, key, 1)
    time.sleep(1.0)  # the request's context expires before any worker starts the job
    spans = _run_job(settings, key, exporter)
    (job,) = [s for s in spans if s.name == "ctxcore.compaction.job"]
    (window,) = [s for s in spans if s.name == "ctxcore.window"]
    assert job.parent is None and not job.links
    assert job.context.trace_id != window.context.trace_id
    stages = [s for s in spans if s.name == "ctxcore.compaction.stage"]
    assert stages and all(s.context.trace_id == job.context.trace_id for s in stages)
