"""The API process's Prometheus metrics (prometheus-client), served at ``GET /metrics``.

Each app owns a ``CollectorRegistry`` (tests build many apps in one process; a module-level
registry would add them up). With one API process its metrics are plain in-process values:
an observation is a lock and an add, no Redis round trip per window. ``ctxcore serve
--workers N`` runs N processes on one port behind uvicorn's supervisor: they record in
prometheus-client's multiprocess mode (each process's values in memory-mapped files of one
directory) and ``/metrics``, whichever process answers, serves their sum. Several API
replicas (hosts) are summed by Prometheus, as any per-instance series.

Labels come from closed sets only: ``status`` (HTTP status codes the routes answer),
``route`` ("window"/"proxy") and ``fallback`` ("true"/"false"). No tenant, conversation or path label: cardinality stays
bounded whatever clients send. Compaction stages run in the workers and are served by each
worker node (``workers/prom_worker.py``), not here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.prom_worker import node_registry

__all__ = ["CONTENT_TYPE", "WINDOW_BUCKETS", "ApiMetrics", "RequestMetricsMiddleware"]

# The text exposition format 0.0.4 (what generate_latest writes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# A window is served in about a millisecond (bench/fast_path.py); the buckets resolve that
# region finely and still place a slow store's seconds.
WINDOW_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ApiMetrics:
    """The API's series in their own registry (see the module docstring)."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Several API processes: /metrics serves the sum of the directory's files (the
        # series above still record there: the value class follows $PROMETHEUS_MULTIPROC_DIR,
        # set before the processes started).
        self._exposed = r if multiprocess_dir is None else node_registry(multiprocess_dir)
        self.fast_path_seconds = Histogram(
            "ctxcore_fast_path_seconds",
            "Wall time of the service's get_window (the fast path), by route (window: POST "
            ".../window; proxy: POST /v1/chat/completions) and whether the synchronous "
            "fallback was applied.",
            ["route", "fallback"],
            buckets=WINDOW_BUCKETS,
            registry=r,
        )
        self.window_request_seconds = Histogram(
            "ctxcore_window_request_seconds",
            "Wall time of POST /v1/conversations/{id}/window requests, from the request "
            "reaching the app to its response's last byte, by status.",
            ["status"],
            buckets=WINDOW_BUCKETS,
            registry=r,
        )
        self.windows = Counter(
            "ctxcore_windows", "Window requests answered, by HTTP status.", ["status"], registry=r
        )
        self.appends = Counter(
            "ctxcore_appends", "Append requests answered, by HTTP status.", ["status"], registry=r
        )
        self.errors = Counter(
            "ctxcore_errors",
            "Responses with a 4xx or 5xx status on any route, by status.",
            ["status"],
            registry=r,
        )
        self._children: dict[tuple[str, ...], Any] = {}
        self._scrape = _ScrapeGauges()
        self._exposed.register(self._scrape)

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        # ``labels()`` takes a lock and builds a key each call (half an observation's cost):
        # the few children (closed label sets) are looked up once.
        key = (str(id(metric)), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, metric.labels(*labels))
        return child

    def window_served(self, seconds: float, fallback: bool, route: str = "window") -> None:
        """One get_window served by ``route`` ("window" or "proxy")."""
        self._child(self.fast_path_seconds, route, "true" if fallback else "false").observe(seconds)

    def request_done(self, kind: str | None, status: int, seconds: float) -> None:
        """One HTTP response: ``kind`` is "window", "append" or None (any other route)."""
        code = str(status)
        if kind == "window":
            self._child(self.windows, code).inc()
            self._child(self.window_request_seconds, code).observe(seconds)
        elif kind == "append":
            self._child(self.appends, code).inc()
        if status >= 400:
            self._child(self.errors, code).inc()

    def render(self, queue_depth: int, dead_letters: int | None) -> bytes:
        """The exposition, with the gauges read at this scrape (the dead-letter depth is
        absent on Redis or while RabbitMQ does not answer, rather than stale)."""
        gauges = {"ctxcore_queue_depth": float(queue_depth)}
        if dead_letters is not None:
            gauges["ctxcore_dead_letter_messages"] = float(dead_letters)
        self._scrape.values = gauges
        return generate_latest(self._exposed)


_GAUGE_HELP = {
    "ctxcore_queue_depth": "Compaction jobs waiting in all tenant queues.",
    "ctxcore_dead_letter_messages": "Messages in the RabbitMQ dead-letter queue <prefix>.dead "
    "(delivered worker.delivery_limit times).",
}


class _ScrapeGauges(Collector):
    """Gauges whose values are read from the stores at each scrape (not kept in-process)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        for name, value in self.values.items():
            yield GaugeMetricFamily(name, _GAUGE_HELP[name], value=value)


def _request_kind(method: str, path: str) -> str | None:
    """ "window" / "append" for the two conversation routes the counters name, else None."""
    if method != "POST" or not path.startswith("/v1/conversations/"):
        return None
    if path.endswith("/window"):
        return "window"
    if path.endswith("/messages"):
        return "append"
    return None


class RequestMetricsMiddleware:
    """A pure ASGI middleware counting responses by status (cheaper than BaseHTTPMiddleware,
    which would wrap every request in a task and a stream)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = _request_kind(scope["method"], scope["path"])
        started = time.perf_counter()
        status = 500  # an exception before any response start is answered 500 by Starlette

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            self.metrics.request_done(kind, status, time.perf_counter() - started)
