"""The OpenTelemetry ``Tracer`` (``ctxcore.telemetry``'s seam) and its exporter: imported
only when ``telemetry`` is on (``workers.telemetry.build_tracer``), never otherwise.

Spans go through a ``BatchSpanProcessor``: a request only appends its span to the
processor's queue (bounded: ``telemetry.max_queue_size`` or ``OTEL_BSP_MAX_QUEUE_SIZE``,
beyond which spans are dropped), and a background thread exports. So an OTLP endpoint that
is down or slow costs requests nothing but that append (bench/telemetry.py). An export that
fails is logged once at WARNING (``DroppingExporter``); the spans of that batch are lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ctxcore import __version__
from ctxcore.config import TelemetrySettings
from ctxcore.telemetry import AttributeValue, Span, activate_span, restore_span

__all__ = ["DroppingExporter", "OtelSpan", "OtelTracer", "otlp_tracer", "span_context", "tracer_with"]

log = logging.getLogger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()
# The OTLP exporter logs every failed batch itself (at ERROR, each retry at WARNING): one
# WARNING of ours (DroppingExporter) says it instead, once.
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
# The batch processor warns once per span it drops from a full queue (an endpoint that hangs):
# a flood; its errors still show.
_PROCESSOR_LOGGER = "opentelemetry.sdk._shared_internal"


def span_context(traceparent: str) -> trace.SpanContext | None:
    """The span context a ``traceparent`` names; None when it does not parse."""
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    found = trace.get_current_span(context).get_span_context()
    return found if found.is_valid else None


class OtelSpan:
    """``ctxcore.telemetry.Span`` over an OpenTelemetry span."""

    __slots__ = ("_counts", "_lists", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._counts: dict[str, int] = {}
        self._lists: dict[str, dict[str, None]] = {}

    def set(self, name: str, value: AttributeValue) -> None:
        """Set an attribute."""
        self.span.set_attribute(name, value)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to an integer attribute."""
        total = self._counts[name] = self._counts.get(name, 0) + amount
        self.span.set_attribute(name, total)

    def append(self, name: str, item: str) -> None:
        """Add to a string-list attribute (each item once)."""
        items = self._lists.setdefault(name, {})
        if item not in items:
            items[item] = None
            self.span.set_attribute(name, list(items))

    def fail(self, error: BaseException) -> None:
        """Record ``error`` and mark the span failed."""
        self.span.record_exception(error)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:300]))


class OtelTracer:
    """``ctxcore.telemetry.Tracer`` over an OpenTelemetry ``TracerProvider``."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("ctxcore", __version__)

    @property
    def enabled(self) -> bool:
        """Always True."""
        return True

    @contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        parent: str | None = None,
        links: Sequence[str] = (),
        root: bool = False,
    ) -> Iterator[Span]:
        """A current span (see ``ctxcore.telemetry.Tracer.span``)."""
        context: otel_context.Context | None = None
        if root:
            context = otel_context.Context()  # an empty context: a new trace
        elif parent is not None:
            context = _PROPAGATOR.extract({"traceparent": parent})
        linked = [Link(found) for found in map(span_context, links) if found is not None]
        with self._tracer.start_as_current_span(
            name,
            context=context,
            attributes=dict(attributes) if attributes else None,
            links=linked,
            record_exception=False,
            set_status_on_exception=False,
        ) as otel_span:
            span = OtelSpan(otel_span)
            token = activate_span(span)
            try:
                yield span
            except BaseException as exc:
                span.fail(exc)
                raise
            finally:
                restore_span(token)

    def traceparent(self) -> str | None:
        """The current context as a ``traceparent``."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier.get("traceparent")

    @contextmanager
    def attached(self, traceparent: str | None) -> Iterator[None]:
        """Continue ``traceparent`` while the block runs."""
        if traceparent is None:
            yield
            return
        token = otel_context.attach(_PROPAGATOR.extract({"traceparent": traceparent}))
        try:
            yield
        finally:
            otel_context.detach(token)


class DroppingExporter(SpanExporter):
    """An exporter whose failures drop the batch and are logged once (WARNING), then only
    counted (``failed_batches``): an endpoint that is down must not flood the logs."""

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.failed_batches = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export, or drop the batch."""
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter is third-party code: a bug in it drops spans only
            return self._dropped(len(spans), f"{type(exc).__name__}: {exc}")
        if result is not SpanExportResult.SUCCESS:
            return self._dropped(len(spans), "the endpoint did not accept them")
        return result

    def _dropped(self, count: int, why: str) -> SpanExportResult:
        with self._lock:
            self.failed_batches += 1
            first = self.failed_batches == 1
        if first:
            log.warning(
                "telemetry: %d span(s) dropped, not exported to %s (%s); later failures are not logged",
                count,
                self.endpoint,
                why,
            )
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped exporter."""
        return self.inner.force_flush(timeout_millis)


def tracer_with(processor: SpanProcessor, service_name: str = "ctxcore") -> OtelTracer:
    """A tracer whose spans go to ``processor`` (tests: a ``SimpleSpanProcessor`` over an
    ``InMemorySpanExporter``)."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(processor)
    return OtelTracer(provider)


def otlp_tracer(settings: TelemetrySettings) -> OtelTracer:
    """The OTLP/HTTP tracer ``settings`` describe; the SDK reads the standard ``OTEL_*``
    variables for what the settings leave unset (endpoint, headers, batching, sampler)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    logging.getLogger(_EXPORTER_LOGGER).setLevel(logging.CRITICAL)
    logging.getLogger(_PROCESSOR_LOGGER).setLevel(logging.ERROR)
    exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint)
    endpoint = settings.otlp_endpoint or "the endpoint of the OTEL_EXPORTER_OTLP_* variables"
    options: dict[str, Any] = {}
    if settings.max_queue_size is not None:
        options["max_queue_size"] = settings.max_queue_size
        # The SDK refuses a batch (default 512) larger than its queue.
        options["max_export_batch_size"] = min(settings.max_queue_size, 512)
    return tracer_with(
        BatchSpanProcessor(DroppingExporter(exporter, endpoint), **options), settings.service_name
    )
