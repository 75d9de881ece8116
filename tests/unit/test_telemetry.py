"""Telemetry without servers: settings, the tracer seam, spans, links, a failing exporter,
and nothing of OpenTelemetry imported while telemetry is off."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey
from ctxcore.state.memory import MemoryMessageLog, MemoryOffloadStore, MemoryStateStore
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.telemetry import NO_SPAN, NO_TRACER, current_span
from ctxcore.tokens import TiktokenCounter
from workers.service import ContextService, InlineQueue
from workers.telemetry import build_tracer, check_telemetry
from workers.telemetry.model import TracedModel
from workers.telemetry.otel import DroppingExporter, OtelTracer, tracer_with
from workers.telemetry.spans import describe_window, window_span

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def spans() -> tuple[OtelTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return tracer_with(SimpleSpanProcessor(exporter)), exporter


def test_telemetry_off_builds_no_exporter_and_imports_no_sdk() -> None:
    # A fresh interpreter: the whole service imported, a runtime's tracer built, spans
    # opened. redis-py 8 and FastAPI import the OpenTelemetry API themselves when it is
    # installed; what ctxcore must not do with telemetry off is load its tracer module, the
    # SDK's tracing or an exporter, or start the batch processor's thread.
    code = textwrap.dedent(
        """
        import sys, threading
        from ctxcore.config import Settings
        from ctxcore.state import ConversationKey
        import workers.http, workers.tasks, workers.celery_tracing
        from workers.runtime import Runtime
        from workers.telemetry.spans import append_span, window_span
        rt = Runtime(Settings())
        with window_span(rt.tracer, ConversationKey("a", "b"), 100, "api") as span:
            span.set("x", 1)
        with append_span(rt.tracer, ConversationKey("a", "b"), 1):
            pass
        assert not rt.tracer.enabled
        loaded = [m for m in sys.modules if m == "workers.telemetry.otel"
                  or m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter"))]
        print(sorted(loaded), sorted(t.name for t in threading.enumerate() if "Span" in t.name))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[] []"


def test_only_the_tracer_module_imports_opentelemetry() -> None:
    found = []
    for root in ("ctxcore", "workers"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n.split(".")[0] == "opentelemetry" for n in names):
                    found.append(path.relative_to(REPO).as_posix())
    assert sorted(set(found)) == ["workers/telemetry/otel.py"]


def test_off_by_default_and_on_with_an_endpoint() -> None:
    assert not Settings().telemetry.on
    assert build_tracer(Settings().telemetry) is NO_TRACER
    on = Settings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert on.telemetry.otlp_endpoint == "http://127.0.0.1:4318/v1/traces" and on.telemetry.on
    assert Settings.load({"telemetry": {"enabled": True}}).telemetry.on


@pytest.mark.parametrize(
    "bad", ["collector:4318", "not a url", "ftp://host/v1/traces", "http://", "http://h:99999"]
)
def test_an_endpoint_that_does_not_parse_is_refused_at_start_up(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"telemetry\.otlp_endpoint"):
        Settings.from_env({"CTXCORE_TELEMETRY__OTLP_ENDPOINT": bad})


def test_spans_roots_links_and_attached_contexts(spans: tuple[OtelTracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    with tracer.span("request", {"a": 1}) as request:
        request.count("n")
        request.count("n", 2)
        request.append("rules", "R1")
        request.append("rules", "R1")
        assert current_span() is request
        context = tracer.traceparent()
        with tracer.span("job", root=True, links=[context or "", "garbage"]):
            pass
    assert current_span() is NO_SPAN
    with tracer.attached(context), tracer.span("stage"):
        pass
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    req, job, stage = by_name["request"], by_name["job"], by_name["stage"]
    assert req.attributes == {"a": 1, "n": 3, "rules": ("R1",)}
    assert job.parent is None and job.context.trace_id != req.context.trace_id
    assert [link.context.span_id for link in job.links] == [req.context.span_id]  # garbage skipped
    assert stage.parent is not None and stage.parent.span_id == req.context.span_id


def test_an_exception_marks_the_span_failed_and_propagates(
    spans: tuple[OtelTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    with pytest.raises(ValueError), tracer.span("boom"):
        raise ValueError("bad")
    (span,) = exporter.get_finished_spans()
    assert not span.status.is_ok and "ValueError: bad" in (span.status.description or "")


class _Failing(SpanExporter):
    def __init__(self, raises: bool) -> None:
        self.raises = raises
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        if self.raises:
            raise ConnectionError("connection refused")
        return SpanExportResult.FAILURE


@pytest.mark.parametrize("raises", [True, False])
def test_a_failing_exporter_drops_spans_and_warns_once(
    raises: bool, caplog: pytest.LogCaptureFixture
) -> None:
    inner = _Failing(raises)
    exporter = DroppingExporter(inner, "http://127.0.0.1:9/v1/traces")
    tracer = tracer_with(SimpleSpanProcessor(exporter))
    with caplog.at_level(logging.WARNING, logger="workers.telemetry.otel"):
        for i in range(5):
            with tracer.span("request") as span:  # the request goes on as if nothing happened
                span.set("i", i)
    assert inner.calls == 5 and exporter.failed_batches == 5
    warnings = [r for r in caplog.records if r.name == "workers.telemetry.otel"]
    assert len(warnings) == 1 and "dropped" in warnings[0].getMessage()


def test_a_summariser_call_is_a_genai_span(spans: tuple[OtelTracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    model = TracedModel(ExtractiveModel(TiktokenCounter()), tracer, "ctxcore.extractive")
    messages = [UserMessage(content="fix the failing test in parser.py"), AssistantMessage(content="done")]
    completion = model.complete(messages, max_tokens=50)
    (span,) = exporter.get_finished_spans()
    attrs = span.attributes or {}
    assert span.name == f"chat {model.name}"
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == model.name
    assert attrs["gen_ai.usage.input_tokens"] == completion.usage.input_tokens > 0
    assert attrs["gen_ai.usage.output_tokens"] == completion.usage.output_tokens
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)


def test_a_failed_summariser_call_names_its_kind(spans: tuple[OtelTracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans

    class Down:
        name = "m"

        def complete(self, messages: object, *, max_tokens: int, contract: object = None) -> object:
            raise ModelCallError("timeout", "no answer")

    with pytest.raises(ModelCallError):
        TracedModel(Down(), tracer, "openai").complete([], max_tokens=5)  # type: ignore[arg-type]
    (span,) = exporter.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "timeout" and not span.status.is_ok


def test_an_otlp_tracer_builds_with_a_small_queue_and_an_endpoint_that_refuses() -> None:
    settings = Settings.load(
        {"telemetry": {"otlp_endpoint": "http://127.0.0.1:9/v1/traces", "max_queue_size": 16}}
    )
    tracer = build_tracer(settings.telemetry)
    assert isinstance(tracer, OtelTracer) and tracer.enabled
    for _ in range(40):  # more than the queue holds: dropped, never raised
        with tracer.span("request"):
            pass
    tracer.provider.shutdown()


def test_a_window_span_names_the_rules_that_changed_the_window(
    spans: tuple[OtelTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    offloads = MemoryOffloadStore()  # the rules offload what they cut
    service = ContextService(Settings(), MemoryStateStore(), MemoryMessageLog(), offloads, InlineQueue())
    key = ConversationKey("acme", "rules")
    messages: list[AnyMessage] = [UserMessage(content="read the logs")]
    for i in range(12):  # long tool results: over the budget, the rules clear and cut them
        call = ToolCall(id=f"c{i}", name="cat", arguments=f'{{"path": "log{i}.txt"}}')
        messages += [
            AssistantMessage(content="", tool_calls=[call]),
            ToolMessage(tool_call_id=call.id, content=f"line {i}: all good here\n" * 300),
        ]
    service.append(key, messages)
    with window_span(tracer, key, 20_000, "api") as span:
        result = service.get_window(key, 20_000)
        describe_window(span, result)
    with window_span(tracer, key, 10**6, "api") as span:  # fits: no rule acts
        describe_window(span, service.get_window(key, 10**6))
    tight, roomy = exporter.get_finished_spans()
    applied = (tight.attributes or {}).get("ctxcore.rules_applied")
    assert applied and all(isinstance(name, str) for name in applied)
    assert (tight.attributes or {})["ctxcore.window.tokens_served"] == result.stats.total_tokens <= 20_000
    assert "ctxcore.rules_applied" not in (roomy.attributes or {})


def test_the_otlp_exporter_of_a_refused_endpoint_logs_one_warning_and_no_flood(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    settings = Settings.load(
        {"telemetry": {"otlp_endpoint": "http://127.0.0.1:9/v1/traces", "max_queue_size": 4}}
    )
    tracer = build_tracer(settings.telemetry)
    assert isinstance(tracer, OtelTracer)
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            for _ in range(10):  # more than the queue holds: the rest are dropped
                with tracer.span("request"):
                    pass
            tracer.provider.force_flush(5000)
    tracer.provider.shutdown()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["workers.telemetry.otel"], [r.getMessage() for r in warnings]


def test_telemetry_on_without_the_extra_fails_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "workers.telemetry.otel", None)  # as if not installed
    settings = Settings.load({"telemetry": {"otlp_endpoint": "http://127.0.0.1:4318/v1/traces"}})
    with pytest.raises(ConfigError, match=r"pip install 'ctxcore\[otel\]'"):
        check_telemetry(settings.telemetry)
    check_telemetry(Settings().telemetry)  # off: nothing to check
