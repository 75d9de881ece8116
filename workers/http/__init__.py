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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.http.app import app_for_serve_workers, app_from_env, create_app, serve

__all__ = ["app_for_serve_workers", "app_from_env", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("workers.http.app"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value
