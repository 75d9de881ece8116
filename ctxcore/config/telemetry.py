"""The ``telemetry`` section: OpenTelemetry traces over OTLP (the ``ctxcore[otel]`` extra)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from ctxcore.config.base import STRICT
from ctxcore.errors import ConfigError

__all__ = ["TelemetrySettings"]


class TelemetrySettings(BaseModel):
    """Traces of windows, appends, compaction jobs, stages and summariser calls.

    Off by default: no exporter is built and nothing of OpenTelemetry is imported. Setting
    ``otlp_endpoint`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, its alias) turns it on;
    ``enabled = true`` turns it on with the endpoint the SDK finds itself in the standard
    ``OTEL_EXPORTER_OTLP_*`` variables (default ``http://localhost:4318``). The SDK's other
    standard variables apply as well (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED``).
    """

    model_config = STRICT
    enabled: bool = False
    # The OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces; refused at start-up
    # when it does not parse as an http(s) URL with a host.
    otlp_endpoint: str | None = None
    # The service.name resource attribute when OTEL_SERVICE_NAME does not set one.
    service_name: str = Field(default="ctxcore", min_length=1, max_length=128)
    # How long a window request's trace context waits for the job it queued: a job that
    # starts later finds it gone and starts its own trace without that link.
    job_context_ttl_seconds: float = Field(default=3600.0, gt=0)
    # At most this many requests' contexts are linked from one job (the first ones that
    # coalesced into it: the one that queued it first); the rest are only counted.
    max_job_links: int = Field(default=32, ge=1, le=128)
    # Spans waiting for the exporter beyond this are dropped: the bound on the memory (and
    # the time) an OTLP endpoint that does not answer can cost a request. None:
    # OTEL_BSP_MAX_QUEUE_SIZE, else the SDK's 2048.
    max_queue_size: int | None = Field(default=None, ge=1)

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  # raises on a port that is not a number in range
        except ValueError as exc:
            raise ConfigError(
                f"does not parse as a URL ({exc}); e.g. http://collector:4318/v1/traces"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname or " " in value:
            raise ConfigError(
                "must be an http:// or https:// URL with a host, e.g. http://collector:4318/v1/traces"
            )
        return value

    @property
    def on(self) -> bool:
        """True when traces are to be exported."""
        return self.enabled or self.otlp_endpoint is not None
