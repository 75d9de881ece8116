"""The unauthenticated operations routes: ``GET /healthz`` and ``GET /metrics``."""

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ctxcore.client.models import HealthResponse
from ctxcore.errors import StoreUnavailable
from workers.http.errors import error_responses
from workers.prom_api import CONTENT_TYPE, ApiMetrics
from workers.redis_clients import check_ready
from workers.runtime import Runtime

__all__ = ["operations_router"]

log = logging.getLogger(__name__)


def operations_router(runtime: Runtime, metrics: ApiMetrics) -> APIRouter:
    """Health over ``runtime``, the API process's ``metrics``."""
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
    def metrics_route() -> Response:
        """This API process's Prometheus metrics (labels from closed sets only: no tenant or
        conversation). Compaction stages are served by each worker node on
        ``worker.metrics_port``."""
        body = metrics.render(runtime.scheduler.depth(), _dead_letters(runtime))
        return Response(body, media_type=CONTENT_TYPE)

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
