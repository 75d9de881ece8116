"""OpenTelemetry glue of the workers: the tracer a process uses (``build_tracer``), the
spans of windows, appends, stages and summariser calls (``spans``, ``model``) and the trace
contexts a compaction job links to (``jobs``); their way through Celery is
``workers.celery_tracing`` (it reads the app's tracer, and the app imports this package).

With ``telemetry`` off, ``build_tracer`` returns ``ctxcore.telemetry.NO_TRACER`` and nothing
of OpenTelemetry is imported: ``otel`` is the only module that imports it, and only from here.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxcore.config import TelemetrySettings
from ctxcore.errors import ConfigError
from ctxcore.telemetry import NO_TRACER, Tracer

__all__ = ["build_tracer", "check_telemetry"]


def build_tracer(settings: TelemetrySettings) -> Tracer:
    """The process's tracer: OTLP over HTTP when ``settings.on``, else ``NO_TRACER``.

    Raises:
        ConfigError: telemetry is on but the ``ctxcore[otel]`` extra is not installed.
    """
    if not settings.on:
        return NO_TRACER
    return _otlp_tracer()(settings)


def check_telemetry(settings: TelemetrySettings) -> None:
    """The start-up check: ``ConfigError`` when telemetry is on and OpenTelemetry is not
    installed (the tracer itself is built by each process on first use, after a fork)."""
    if settings.on:
        _otlp_tracer()


def _otlp_tracer() -> Callable[[TelemetrySettings], Tracer]:
    try:
        from workers.telemetry.otel import otlp_tracer
    except ImportError as exc:
        raise ConfigError(
            f"telemetry is on (telemetry.otlp_endpoint or telemetry.enabled) but OpenTelemetry is not "
            f"installed ({exc}): pip install 'ctxcore[otel]', or turn telemetry off"
        ) from exc
    return otlp_tracer
