"""Fixtures of the chaos tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.processes import RedisProcess


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[str]:
    """The URL of a scratch ``redis-server`` owned by this test (free port, no persistence).

    Queue and kombu key names carry each test's key prefix, but tests that run real workers
    kill and restart servers: those must never hit a shared one, and nothing shared is
    ever flushed.
    """
    server = RedisProcess(tmp_path / "private-redis", durable=False)
    server.start()
    yield server.url
    # A task sent from this process (a retry sent by an in-process worker included) is
    # subscribed to until its AsyncResult is collected, often from a reference cycle. Left
    # to a later collection, its __del__ retries the unsubscribe against this dead server
    # for ~20 s in whichever thread of a later test allocates: collect it while it answers.
    gc.collect()
    server.kill()
