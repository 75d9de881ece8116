"""The web inspector under ``/ui`` of ``ctxcore serve``: server-rendered pages, no script.

``workers.ui.sessions`` signs a tenant in (a bearer token, once, into a session cookie),
``workers.ui.pages`` gathers what each page shows from the runtime's stores, and
``workers.ui.routes`` serves the pages (Jinja2 templates, autoescaped) under a
Content-Security-Policy that allows no script at all.
"""

from workers.ui.routes import ui_router

__all__ = ["ui_router"]
