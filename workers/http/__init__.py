"""The HTTP API: ``create_app(runtime, queue)`` builds the FastAPI app (``workers.http.app``,
whose docstring lists the routes and statuses).

Serve it with ``uvicorn workers.http:app_from_env --factory`` or ``serve(settings)``.

Layout: the app factory and serving in ``app``; what the routes share (``ApiState``, path and
header parameters) in ``dependencies``; the bearer token and rate limit in ``auth``; the error
bodies and handlers in ``errors``, from the table of ``error_statuses``; the compaction status
as published in ``compaction_status``; one router per resource in ``routes/``.

The names are loaded on first use: a module of this package (``workers.http.errors``,
imported by the proxy, the UI and admission) does not pull in the app and every router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxcore.lazy import lazy_getattr

if TYPE_CHECKING:
    from workers.http.app import app_for_serve_workers, app_from_env, create_app, serve

__all__ = ["app_for_serve_workers", "app_from_env", "create_app", "serve"]


__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "workers.http.app"), globals())
