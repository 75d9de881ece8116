"""Distribution glue: Celery app and tasks, the fast-path service, HTTP API and CLI.

Everything that imports Celery, FastAPI or talks to a broker lives here; ``ctxcore``
stays a pure library.
"""
