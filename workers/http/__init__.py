"""The HTTP API: ``create_app(runtime, queue)`` builds the FastAPI app (``workers.http.app``,
whose docstring lists the routes and statuses).

Serve it with ``uvicorn workers.http:app_from_env --factory`` or ``serve(settings)``.

Layout: the app factory and serving in ``app``; the path and header parameters the routes
share in ``dependencies``; the handlers answering every error in ``errors``; the compaction
status as published in ``compaction_status``; one router per resource in ``routes/``. What
the API shares with the proxy, the UI and admission (``ApiState``, the bearer token and rate
limit, ``ApiError`` and the table of statuses) is ``workers.api_common``, below all four.

The names are loaded on first use: importing a module of this package does not pull in the
app and every router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxcore.lazy import lazy_getattr

if TYPE_CHECKING:
    from workers.http.app import app_for_serve_workers, app_from_env, create_app, serve

__all__ = ["app_for_serve_workers", "app_from_env", "create_app", "serve"]


__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "workers.http.app"), globals())
