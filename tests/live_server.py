"""The real API on a loopback port (uvicorn in a thread) and, optionally, a real Celery worker.

Used by the client and adapter tests: everything goes through HTTP as a user's agent would.
Each ``LiveApi`` has a key prefix of its own; ``close()`` deletes exactly its keys.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import redis
import uvicorn

from ctxcore.config import Settings, hash_token
from tests.chaos.processes import free_port
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime

__all__ = ["TOKEN", "LiveApi", "serve_api"]

TOKEN = "live-token-of-acme"
SLOW_TOKEN = "live-token-of-slow"


@dataclass
class LiveApi:
    """A running API: its URL, the tokens it accepts, its runtime (stores) and settings."""

    url: str
    settings: Settings
    runtime: Runtime
    server: uvicorn.Server
    thread: threading.Thread
    worker: AbstractContextManager[Any] | None = None
    clean_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Stop the server (and worker), then delete this API's keys."""
        self.server.should_exit = True
        self.thread.join(10)
        if self.worker is not None:
            self.worker.__exit__(None, None, None)
        self.runtime.redis.close()
        if self.clean_url is not None:
            client = redis.Redis.from_url(self.clean_url)
            try:
                delete_prefixed_keys(client, self.settings.redis.key_prefix)
            finally:
                client.close()


def _settings(redis_url: str, overrides: dict[str, Any]) -> Settings:
    data: dict[str, Any] = {
        "redis": {"url": redis_url, "key_prefix": f"live{uuid.uuid4().hex[:8]}"},
        "http": {"tokens": {hash_token(TOKEN): "acme", hash_token(SLOW_TOKEN): "slow"}},
        "tenants": {"slow": {"requests_per_second": 1}},
        "worker": {"retry_delays": [0.1, 0.2, 0.4], "lock_timeout": 10},
    }
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return Settings.load(data)


def serve_api(redis_url: str, *, worker: bool, clean: bool = True, **overrides: Any) -> LiveApi:
    """Start the app on a free 127.0.0.1 port (with a Celery worker when ``worker``)."""
    from workers.http import create_app
    from workers.service import InlineQueue

    settings = _settings(redis_url, overrides)
    runtime = Runtime(settings)
    started_worker: AbstractContextManager[Any] | None = None
    if worker:
        from tests.workers_fixture import in_process_worker

        # Entered here, left in ``close()``: the API outlives this call.
        started_worker = in_process_worker(settings)
        started_worker.__enter__()
        app = create_app(runtime)
    else:
        app = create_app(runtime, InlineQueue())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    return LiveApi(
        url=f"http://127.0.0.1:{port}",
        settings=settings,
        runtime=runtime,
        server=server,
        thread=thread,
        worker=started_worker,
        clean_url=redis_url if clean else None,
    )


@contextlib.contextmanager
def live_api(redis_url: str, *, worker: bool, **overrides: Any) -> Iterator[LiveApi]:
    """``serve_api`` as a context manager."""
    api = serve_api(redis_url, worker=worker, **overrides)
    try:
        yield api
    finally:
        api.close()
