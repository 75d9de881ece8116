"""The HTTP API (workers/http/) against a real Redis, with an ``InlineQueue`` instead of Celery:
who may call (tokens, tenants) and how much (conversations, bodies, rates, a store outage)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import hash_token
from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey
from tests.integration.http_api.helpers import AUTH_A, AUTH_B, CONV, TOKEN_A, TOKEN_B, Api, assistant, user
from workers.http import create_app
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = pytest.mark.redis


# --- auth and isolation ------------------------------------------------------------------


def test_auth_missing_wrong_and_right_token(api: Api) -> None:
    missing = api.client.post(f"{CONV}/c1/messages", json={"messages": [user("hi")]})
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert missing.json()["error"] == "unauthorized"

    for header in ("Bearer not-a-configured-token", f"Basic {TOKEN_A}", "Bearer", TOKEN_A):
        wrong = api.client.post(
            f"{CONV}/c1/messages", json={"messages": [user("hi")]}, headers={"Authorization": header}
        )
        assert wrong.status_code == 401, header
        assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
    # A configured digest used as the token itself must not authenticate.
    digest = {"Authorization": f"Bearer {hash_token(TOKEN_A)}"}
    assert api.client.get(CONV, headers=digest).status_code == 401

    right = api.append("c1", [user("hi")])
    assert right.status_code == 201
    assert right.json() == {"ids": ["000000000001"], "last_id": "000000000001"}
    assert right.headers["ETag"] == '"000000000001"'
    # Unauthenticated operational routes.
    assert api.client.get("/healthz").json() == {"status": "ok"}


def test_another_tenants_conversation_is_exactly_a_missing_one(api: Api) -> None:
    assert api.append("shared-name", [user("tenant A's task"), assistant("ok")]).status_code == 201
    key_a = ConversationKey("tenant-a", "shared-name")
    handle = "00ff00ff00ff00ff"
    api.runtime.offloads.put_if_absent(key_a, handle, [UserMessage(content="offloaded")])

    missing = api.client.get(f"{CONV}/never-existed/state", headers=AUTH_B)
    assert missing.status_code == 404
    # An id no tenant can own: 422 stating the id rule (it reveals nothing about anyone's).
    invalid = api.client.get(f"{CONV}/.invalid/state", headers=AUTH_B)
    assert invalid.status_code == 422 and invalid.json()["error"] == "invalid_conversation_id"
    assert "1-128 characters" in invalid.json()["detail"]

    requests = [
        ("GET", f"{CONV}/shared-name/state", None),
        ("GET", f"{CONV}/shared-name/state?history=1", None),
        ("POST", f"{CONV}/shared-name/window", {"budget_tokens": 1000}),
        ("POST", f"{CONV}/shared-name/compact", None),
        ("DELETE", f"{CONV}/shared-name", None),
    ]
    for method, path, body in requests:
        r = api.client.request(method, path, json=body, headers=AUTH_B)
        never = api.client.request(
            method, path.replace("shared-name", "never-existed"), json=body, headers=AUTH_B
        )
        assert r.status_code == 404, (method, path)
        assert r.content == never.content == missing.content, (method, path)
    offload = api.client.get(f"{CONV}/shared-name/offloads/{handle}", headers=AUTH_B)
    assert offload.status_code == 404
    assert api.client.get(CONV, headers=AUTH_B).json() == {"conversations": [], "next": None}
    assert api.queue.requests == []

    # The same id is another conversation in tenant B's namespace.
    assert api.append("shared-name", [user("B's own")], headers=AUTH_B).json()["ids"] == ["000000000001"]
    assert api.client.get(f"{CONV}/shared-name/offloads/{handle}", headers=AUTH_B).status_code == 404

    # Tenant A still has everything.
    assert api.client.get(f"{CONV}/shared-name/state", headers=AUTH_A).status_code == 200
    own = api.client.get(f"{CONV}/shared-name/offloads/{handle}", headers=AUTH_A)
    assert own.status_code == 200
    assert own.json()["messages"][0]["content"] == "offloaded"
    assert api.runtime.log.last_id(key_a) == "000000000002"


def test_every_token_digest_is_compared(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.api_common.auth

    calls: list[str] = []
    real = workers.api_common.auth.hmac.compare_digest

    def counting(a: str, b: str) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(workers.api_common.auth.hmac, "compare_digest", counting)
    configured = set(api.runtime.settings.http.tokens)
    for token in (TOKEN_A, TOKEN_B, "unknown"):
        calls.clear()
        api.client.get("/v1/usage", headers={"Authorization": f"Bearer {token}"})
        # No early exit on a match: the work does not depend on which token it was.
        assert set(calls) == configured and len(calls) == len(configured), token


# --- limits ------------------------------------------------------------------------------


def test_oversized_bodies_are_413_before_parsing(make_api: Callable[..., Api]) -> None:
    api = make_api(http={"max_body_bytes": 2000})
    big = {"messages": [user("x" * 5000)]}
    declared = api.client.post(f"{CONV}/c1/messages", json=big, headers=AUTH_A)
    assert declared.status_code == 413
    assert declared.json()["error"] == "body_too_large"
    # Rejected before authentication too: the body limit protects every route.
    assert api.client.post(f"{CONV}/c1/messages", json=big).status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}]}'

    chunked = api.client.post(
        f"{CONV}/c1/messages", content=chunks(), headers={**AUTH_A, "Content-Type": "application/json"}
    )
    assert chunked.status_code == 413
    assert api.runtime.log.last_id(ConversationKey("tenant-a", "c1")) is None

    def small() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", '
        yield b'"content": "short"}]}'

    ok = api.client.post(
        f"{CONV}/c1/messages", content=small(), headers={**AUTH_A, "Content-Type": "application/json"}
    )
    assert ok.status_code == 201


@pytest.mark.parametrize("store", ["redis", pytest.param("redis_cluster", marks=pytest.mark.redis_cluster)])
def test_rate_limit_is_per_tenant_with_retry_after(
    make_api: Callable[..., Api], store: str, request: pytest.FixtureRequest
) -> None:
    on_cluster = {"cluster_nodes": request.getfixturevalue("redis_cluster_nodes")} if store != "redis" else {}
    api = make_api(
        redis=on_cluster,
        http={"requests_per_second": 0.2, "burst": 3},
        tenants={"tenant-b": {"requests_per_second": 1000}},
    )
    statuses = [api.client.get(CONV, headers=AUTH_A).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    limited = api.client.get(CONV, headers=AUTH_A)
    assert limited.status_code == 429 and limited.json()["error"] == "rate_limited"
    retry_after = int(limited.headers["Retry-After"])
    assert 1 <= retry_after <= 5  # one token takes 5 s at 0.2/s
    # Tenant B has its own bucket (and a higher rate): unaffected.
    assert [api.client.get(CONV, headers=AUTH_B).status_code for _ in range(6)] == [200] * 6
    # Another API process over the same Redis shares tenant A's bucket.
    other = Runtime(api.runtime.settings)
    try:
        with TestClient(create_app(other, InlineQueue())) as second:
            assert second.get(CONV, headers=AUTH_A).status_code == 429
    finally:
        other.redis.close()
