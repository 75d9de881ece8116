"""The unauthenticated operations routes: ``GET /healthz`` and ``GET /metrics``."""

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from ctxcore.client.models import HealthResponse
from ctxcore.errors import StoreUnavailable
from workers.http_errors import error_responses
from workers.metrics import Metrics
from workers.redis_clients import check_ready
from workers.runtime import Runtime

__all__ = ["operations_router", "window_metrics"]

log = logging.getLogger(__name__)


def operations_router(runtime: Runtime) -> APIRouter:
    """Health and metrics over ``runtime``."""
    router = APIRouter()

    @router.get(
        "/healthz",
        response_model=HealthResponse,
        responses={
            503: {"model": HealthResponse, "description": "Redis does not answer, or its cluster is down"}
        },
        tags=["operations"],
    )
    def healthz() -> JSONResponse:
        """Liveness and readiness: 200 when Redis answers PING (a cluster: ``CLUSTER INFO``
        says ``cluster_state:ok``), else 503."""
        try:
            check_ready(runtime.redis)
        except StoreUnavailable as exc:
            log.warning("health check failed: %s", exc)
            return JSONResponse({"status": "unavailable"}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    @router.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "Prometheus text exposition format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **error_responses(503),
        },
        tags=["operations"],
    )
    def metrics() -> PlainTextResponse:
        """Service metrics (no tenant or conversation labels: cardinality stays bounded)."""
        extra = {"ctxcore_queue_depth": float(runtime.scheduler.depth())}
        dead = _dead_letters(runtime)
        if dead is not None:
            extra["ctxcore_dead_letter_messages"] = float(dead)
        return PlainTextResponse(
            runtime.metrics.render(extra=extra), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return router


def _dead_letters(runtime: Runtime) -> int | None:
    """Depth of RabbitMQ's ``<prefix>.dead`` (None on Redis, or while RabbitMQ is down:
    the other series are still served)."""
    from kombu.exceptions import OperationalError

    from workers.broker_queues import dead_letter_depth

    try:
        return dead_letter_depth(runtime.settings)
    except (OperationalError, OSError) as exc:
        log.warning("dead-letter depth not read: the broker does not answer (%s)", exc)
        return None


def window_metrics(metrics: Metrics, tenant: str, seconds: float, fallback: bool) -> None:
    """A window's metrics in one pipeline, run after its response is sent."""
    also = "ctxcore_fallback_windows_total" if fallback else None
    metrics.observe("ctxcore_fast_path_seconds", seconds, tenant=tenant, also=also)
