"""Fixtures of the HTTP API tests: an API over the test Redis with a key prefix of its own."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from tests.integration.http_api.helpers import Api, settings_for
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue


@pytest.fixture()
def make_api(redis_url: str) -> Iterator[Callable[..., Api]]:
    """Build an API over the test Redis with a key prefix of its own (its keys are deleted
    afterwards, nothing else is); ``overrides`` are settings sections."""
    made: list[tuple[TestClient, Runtime]] = []

    def make(url: str | None = None, **overrides: Any) -> Api:
        settings = settings_for(url or redis_url, f"http{uuid.uuid4().hex[:8]}", **overrides)
        runtime = Runtime(settings)
        queue = InlineQueue()
        client = TestClient(create_app(runtime, queue))
        made.append((client, runtime))
        return Api(client, runtime, queue)

    yield make
    cleaner = redis.Redis.from_url(redis_url)
    try:
        for client, runtime in made:
            client.close()
            if runtime.settings.redis.cluster_nodes:  # the keys are on the cluster
                delete_prefixed_keys(runtime.redis, runtime.settings.redis.key_prefix)
            elif runtime.settings.redis.url == redis_url:
                delete_prefixed_keys(cleaner, runtime.settings.redis.key_prefix)
            runtime.redis.close()
    finally:
        cleaner.close()


@pytest.fixture()
def api(make_api: Callable[..., Api]) -> Api:
    """The default API: two tenants, generous limits."""
    return make_api()
