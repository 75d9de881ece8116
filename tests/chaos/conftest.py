"""Fixtures of the chaos tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.helpers import RedisProcess


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[str]:
    """The URL of a scratch ``redis-server`` owned by this test (free port, no persistence).

    Celery's queue names are fixed, so tests that run real workers get a server of their
    own: two test runs on one machine (or anything else on the shared server) cannot steal
    each other's messages, and nothing shared is flushed.
    """
    server = RedisProcess(tmp_path / "private-redis", durable=False)
    server.start()
    yield server.url
    server.kill()
