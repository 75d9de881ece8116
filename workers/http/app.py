"""The HTTP API over the fast path: ``create_app(runtime, queue)`` builds a FastAPI app.

Serve it with ``uvicorn workers.http:app_from_env --factory`` (``app_from_env`` is the one
place that reads the environment) or ``serve(settings)``. Importing this module reads no
environment and opens no connection.

Routes (``/v1/*`` need ``Authorization: Bearer <token>``; the tenant is looked up by the
token's sha256 in ``http.tokens``):

- ``POST   /v1/conversations/{id}/messages``       append (idempotent by ``message_id``;
  ``If-Match: <last log id>`` -> 409 when the log ends elsewhere); 201, or 200 when every
  message was already logged
- ``POST   /v1/conversations/{id}/window``         the window within ``budget_tokens``, its
  ``tools``, ``compaction`` (``idle|queued|running|failing|paused``) and ``compaction_detail``;
  ``?format=openai`` serves OpenAI keys only
- ``GET    /v1/conversations/{id}/messages``       the raw log, paged (``after``, ``limit``)
- ``DELETE /v1/conversations/{id}/messages?after=`` remove the messages after a log id (409
  ``truncate_refused`` when a compaction covers one, the lock is busy or ``If-Match`` moved)
- ``POST   /v1/conversations/{id}/compact``        ask for background compaction; 202 (a
  ``failing`` conversation is not queued again until its failure backoff passes)
- ``GET    /v1/conversations/{id}/state``          blocks with provenance (``?history=1``)
  ``compaction`` and ``compaction_detail`` (the last error, the last success, the hold)
- ``GET    /v1/conversations/{id}/offloads/{h}``   offloaded originals
- ``GET    /v1/conversations/{id}/journal``        the stage journal, newest first (``limit``)
- ``POST   /v1/conversations/{id}/rollback``       a kept state version made current again
  (409 ``version_not_kept`` naming the kept ones; nothing changed)
- ``GET    /v1/conversations``                     the tenant's conversations, paged
- ``DELETE /v1/conversations/{id}``                log, state, offloads and queued work; 204
- ``GET    /v1/usage``                             the tenant's summariser calls and tokens
- ``GET    /healthz``, ``GET /metrics``            unauthenticated
- ``/ui/...``                                       the web inspector (``workers.ui``): sign in
  with a token into a session cookie; HTML pages without script

Status codes: 401 (no or unknown token, with ``WWW-Authenticate: Bearer``); 403 (tenant's
``max_conversations`` reached by an append that would create one more); 404 for an
unknown conversation and another tenant's conversation alike (byte-identical bodies: a
caller learns nothing about ids it does not own); 422 ``invalid_conversation_id`` stating
the id rule for an id no tenant can own; 409 (``If-Match`` mismatch, with
the log's ``last_id`` and ``ETag``; ``invalid_window`` when the saved state cannot be served
without breaking the chat protocol, naming the violations: roll back; or a compaction
holding the conversation's lock during DELETE); 413 (body over ``http.max_body_bytes``, checked before any parsing); 422 (invalid message,
naming its index and field; ``BudgetExceeded`` with its three sizes; malformed request);
429 (per-tenant token bucket, with ``Retry-After``); 503 (store outage, ``Retry-After: 1``).
Every error body is JSON ``{"error": <code>, "detail": ...}`` plus code-specific fields.

Layout (arrows: imports). This module only wires; each router translates HTTP to calls of
``ContextService`` (``workers.service``: appends with ``If-Match``, windows, recall) or of
the runtime's stores, and errors to responses through the one table:

    app (create_app) -> api_common.auth (bearer token, rate limit) -> api_common.state (ApiState)
                     -> routes.log (messages: append, read, truncate) -> service, truncate
                     -> routes.window (window) -> service
                     -> routes.state (compact, state, offloads) -> compaction_status (models)
                     -> routes.history (journal, rollback) -> rollback
                     -> routes.conversations (list, delete, usage) -> workers.delete
                     -> routes.recall, proxy, routes.ops (healthz, metrics)
                     -> errors (handlers) -> api_common.error_statuses (ERROR_STATUSES)
                     -> proxy.errors (the proxy's own handler)
    routes.* -> dependencies (path and header parameters), api_common.errors (ApiError)

Request and response models are ``ctxcore.client.models`` (the client parses them too).
"""

import json
import logging
import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from ctxcore import __version__
from ctxcore.config import Settings
from workers.admission import AdmissionMiddleware
from workers.api_common.auth import tenant_dependency
from workers.api_common.state import ApiState
from workers.bodylimit import BodyLimitMiddleware
from workers.http.errors import install_error_handlers
from workers.http.routes.conversations import conversations_router
from workers.http.routes.history import history_router
from workers.http.routes.log import log_router
from workers.http.routes.ops import operations_router
from workers.http.routes.recall import recall_router
from workers.http.routes.state import state_router
from workers.http.routes.window import window_router
from workers.logs import apply_log_format, uvicorn_log_config
from workers.prom_api import RequestMetricsMiddleware
from workers.proxy.errors import install_proxy_error_handler
from workers.proxy.routes import proxy_router
from workers.runtime import Runtime, check_startup
from workers.service import CompactionQueue
from workers.ui import ui_router

__all__ = ["app_for_serve_workers", "app_from_env", "create_app", "serve"]

# How ``serve`` hands its settings and metrics directory to its N processes.
SERVE_SETTINGS_ENV = "CTXCORE_SERVE_SETTINGS"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def create_app(
    runtime: Runtime, queue: CompactionQueue | None = None, *, metrics_dir: str | None = None
) -> FastAPI:
    """The HTTP API over ``runtime``'s stores (see the module docstring).

    ``queue`` defaults to ``workers.tasks.CeleryQueue`` (Celery is then configured from
    ``runtime.settings`` so compaction requests reach the configured broker); tests pass an
    ``InlineQueue``. ``metrics_dir``: one of several API processes (``serve`` with
    ``http.workers`` > 1): ``/metrics`` serves the sum over the directory's processes.
    """
    if queue is None:
        from workers.app import configure
        from workers.tasks import CeleryQueue

        configure(runtime.settings)
        queue = CeleryQueue()
    api = ApiState(runtime, queue, metrics_dir)

    app = FastAPI(
        title="ctxcore",
        version=__version__,
        description="Context engine for LLM agents: append messages, get windows within a token "
        "budget, compact in the background. Authenticate with `Authorization: Bearer <token>`.",
    )
    # Inside the body limit (a body over it is a 413, never charged): the tenant's request
    # rate, body bytes and requests in flight, before the body is read.
    app.add_middleware(AdmissionMiddleware, api=api)
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.http.max_body_bytes)
    # Outermost (added last): a 413 from the body limit is counted too.
    app.add_middleware(RequestMetricsMiddleware, metrics=api.metrics)
    install_error_handlers(app)
    install_proxy_error_handler(app)

    current_tenant = tenant_dependency(api)
    for router in (
        log_router(api, current_tenant),
        recall_router(api, current_tenant),
        proxy_router(api),
        window_router(api, current_tenant),
        state_router(api, current_tenant),
        history_router(api, current_tenant),
        ui_router(api),
        conversations_router(api, current_tenant),
        operations_router(runtime, api.metrics),
    ):
        app.include_router(router)
    return app


def app_from_env() -> FastAPI:
    """The app configured from ``CTXCORE_*`` (for ``uvicorn workers.http:app_from_env --factory``)."""
    settings = Settings.from_env()
    apply_log_format(settings)  # uvicorn configured its logging before calling the factory
    check_startup(settings)
    if settings.http.workers > 1:
        logging.getLogger(__name__).warning(
            "http.workers = %d is read by `ctxcore serve`; under uvicorn itself give it --workers %d "
            "(with PROMETHEUS_MULTIPROC_DIR set, /metrics sums the processes)",
            settings.http.workers,
            settings.http.workers,
        )
    # uvicorn --workers N with $PROMETHEUS_MULTIPROC_DIR: the processes' sum on /metrics.
    return create_app(Runtime(settings), metrics_dir=os.environ.get(METRICS_DIR_ENV))


def app_for_serve_workers() -> FastAPI:
    """One of ``serve``'s N processes (uvicorn imports this factory in each): the settings
    ``serve`` was given, passed as JSON in ``CTXCORE_SERVE_SETTINGS``, and its metrics in the
    shared multiprocess directory."""
    settings = Settings.load(json.loads(os.environ[SERVE_SETTINGS_ENV]))
    apply_log_format(settings)
    return create_app(Runtime(settings), metrics_dir=os.environ[METRICS_DIR_ENV])


def serve(settings: Settings, *, log_level: str = "info") -> None:
    """Run the API with uvicorn on ``http.host:http.port`` (the CLI's ``ctxcore serve``),
    in ``http.workers`` processes: more than one runs uvicorn's supervisor, which starts each
    process afresh (``app_for_serve_workers``) and restarts one that dies."""
    import uvicorn

    options: dict[str, Any] = {
        "host": settings.http.host,
        "port": settings.http.port,
        "log_level": log_level,
        "log_config": uvicorn_log_config(settings),
        "access_log": settings.http.access_log,
    }
    if settings.http.workers == 1:
        uvicorn.run(create_app(Runtime(settings)), **options)
        return
    from workers.prom_worker import enable_multiprocess

    # Set before the processes start: each imports prometheus-client with the directory
    # in its environment (under $PROMETHEUS_MULTIPROC_DIR/api when that is set, stale files
    # of an earlier run removed; else a temporary directory removed at exit).
    base = os.environ.get(METRICS_DIR_ENV)
    enable_multiprocess(str(Path(base) / "api") if base else None)
    os.environ[SERVE_SETTINGS_ENV] = settings.model_dump_json()
    uvicorn.run("workers.http:app_for_serve_workers", factory=True, workers=settings.http.workers, **options)
