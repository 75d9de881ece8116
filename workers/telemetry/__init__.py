"""OpenTelemetry glue of the workers: the tracer a process uses (``build_tracer``), the
spans of windows, appends, stages and summariser calls (``spans``, ``model``), the trace
contexts a compaction job links to (``jobs``) and their way through Celery (``celery_glue``).

With ``telemetry`` off, ``build_tracer`` returns ``ctxcore.telemetry.NO_TRACER`` and nothing
of OpenTelemetry is imported: ``otel`` is the only module that imports it, and only from here.
"""

from __future__ import annotations

from ctxcore.config import TelemetrySettings
from ctxcore.telemetry import NO_TRACER, Tracer

__all__ = ["build_tracer"]


def build_tracer(settings: TelemetrySettings) -> Tracer:
    """The process's tracer: OTLP over HTTP when ``settings.on``, else ``NO_TRACER``.

    Raises:
        ConfigError: telemetry is on but the ``ctxcore[otel]`` extra is not installed.
    """
    if not settings.on:
        return NO_TRACER
    try:
        from workers.telemetry.otel import otlp_tracer
    except ImportError as exc:
        from ctxcore.errors import ConfigError

        raise ConfigError(
            f"telemetry is on (telemetry.otlp_endpoint or telemetry.enabled) but OpenTelemetry is not "
            f"installed ({exc}): pip install 'ctxcore[otel]', or turn telemetry off"
        ) from exc
    return otlp_tracer(settings)
