"""One table answers every error the core raises: no route answers 500 for one.

Every ``CtxcoreError`` subclass defined in ``ctxcore/`` or ``workers/`` (found by importing
them all) is raised from the service call behind a route; the ctxcore API answers with the
table's status and code, the proxy with the same status in OpenAI's body.
"""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

import ctxcore
import workers
from ctxcore.config import Settings, hash_token
from ctxcore.errors import CtxcoreError, Violation
from workers.api_common.error_statuses import ERROR_STATUSES, error_status
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.proxy.errors import ProxyError
from workers.runtime import Runtime
from workers.service import ContextService, InlineQueue

TOKEN = "secret-token-of-the-error-table"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "redis://internal-host-7:6379"  # in every message: responses that mask must drop it
MODEL = "table-model"
# Failures of the server's side (and an invalid id): their text never reaches the client.
MASKED = {
    "StoreError",
    "StoreUnavailable",
    "ModelError",
    "ModelCallError",
    "CallTooLarge",
    "StageFailedError",
    "CircuitOpenError",
    "ApiError",
    "InvalidKeyError",
    "OperationFailed",
}


def _every_error_class() -> list[type[CtxcoreError]]:
    for package in (ctxcore, workers):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)
    found: set[type[CtxcoreError]] = {CtxcoreError}
    stack = [CtxcoreError]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub.__module__.startswith(("ctxcore.", "workers.")) and sub not in found:
                found.add(sub)
                stack.append(sub)
    return sorted(found, key=lambda kind: f"{kind.__module__}.{kind.__qualname__}")


CLASSES = _every_error_class()
# Positional arguments of the classes whose constructor takes more than a message.
ARGS: dict[str, tuple[Any, ...]] = {
    "InvalidMessageError": (0, "role", f"bad role near {SECRET}"),
    "InvalidRequestError": ("budget_tokens", f"must be positive, near {SECRET}"),
    "UnsupportedItemError": (0, "reasoning", f"no chat form ({SECRET})"),
    "BudgetExceeded": (100, 60, 30, 40),
    "ModelError": ("timeout", f"model at {SECRET} timed out"),
    "ModelCallError": ("timeout", f"model at {SECRET} timed out"),
    "CallTooLarge": (f"l0 {SECRET}", 900, 256, 837),
    "StageFailedError": ("timeout", f"model at {SECRET} timed out"),
    "CircuitOpenError": (SECRET, 12.5),
    "InvalidWindowError": ([Violation(3, "orphan_tool_result", "no call")], 7),
    "RecallDisabled": ("recall.enabled",),
    "TruncateRefused": ("covered", f"covered by a summary ({SECRET})"),
    "ProxyError": (400, f"bad request ({SECRET})", "test_code"),
}


def instance(kind: type[CtxcoreError]) -> CtxcoreError:
    """An instance of ``kind`` whose message names ``SECRET`` (where it has a message)."""
    return kind(*ARGS.get(kind.__name__, (f"{kind.__name__} at {SECRET}",)))


def test_the_table_lists_every_error_class_with_one_non_500_status() -> None:
    # ProxyError carries its own status (the proxy's table, in OpenAI's body).
    missing = [kind.__qualname__ for kind in CLASSES if kind not in ERROR_STATUSES and kind is not ProxyError]
    assert missing == []
    assert {kind.__name__ for kind in CLASSES} >= {"CircuitOpenError", "StageFailedError", "TruncateRefused"}
    for kind, entry in ERROR_STATUSES.items():
        assert 400 <= entry.status < 600 and entry.status != 500 and entry.code, kind
        assert error_status(instance(kind)) is entry  # a subclass never answers as its base


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[TestClient]:
    prefix = f"errtable{uuid.uuid4().hex[:8]}"
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "http": {
                "tokens": {hash_token(TOKEN): "tenant-t"},
                "requests_per_second": 10_000,
                "burst": 10_000,
            },
            "proxy": {"context_window_tokens": {MODEL: 50_000}, "upstream_base_url": "http://127.0.0.1:9/v1"},
        }
    )
    runtime = Runtime(settings)
    client = TestClient(create_app(runtime, InlineQueue()), raise_server_exceptions=False)
    try:
        yield client
    finally:
        client.close()
        runtime.redis.close()
        delete_prefixed_keys(redis.Redis.from_url(redis_url), prefix)


def _raising(error: CtxcoreError) -> Callable[..., Any]:
    def call(*_: Any, **__: Any) -> Any:
        raise error

    return call


@pytest.mark.redis
@pytest.mark.parametrize("kind", CLASSES, ids=lambda kind: kind.__qualname__)
def test_no_route_answers_500_for_an_error_of_the_core(
    kind: type[CtxcoreError], api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = instance(kind)
    monkeypatch.setattr(ContextService, "get_window", _raising(error))
    monkeypatch.setattr(ContextService, "append", _raising(error))
    user = {"role": "user", "content": "hello"}
    window = api.post("/v1/conversations/c1/window", json={"budget_tokens": 4000}, headers=AUTH)
    appended = api.post("/v1/conversations/c1/messages", json={"messages": [user]}, headers=AUTH)
    proxied = api.post("/v1/chat/completions", json={"model": MODEL, "messages": [user]}, headers=AUTH)
    for response in (window, appended, proxied):
        assert response.status_code != 500, (response.request.url, response.text)
        if kind.__name__ in MASKED:
            assert SECRET not in response.text  # the server's side: the detail is in its log
    if kind is ProxyError:
        assert window.status_code == 400 and window.json()["error"]["code"] == "test_code"
        return
    entry = error_status(error)
    # The routes translate a few errors themselves (a window's unknown conversation is the
    # masked 404, an append's conflict carries If-Match's last id): same status, their code.
    assert (window.status_code, window.json()["error"]) in {(entry.status, entry.code), (404, "not_found")}
    assert appended.status_code == entry.status and appended.json()["error"] in {entry.code, "conflict"}
    assert proxied.status_code in {entry.status, 400}  # the proxy's own rules answer 400
    assert isinstance(proxied.json()["error"]["code"], str)
    if kind.__name__ in {"InvalidWindowError", "RecallDisabled", "TruncateRefused", "BudgetExceeded"}:
        assert set(entry.fields(error)) <= set(window.json()) or set(entry.fields(error)) <= set(
            appended.json()
        )
