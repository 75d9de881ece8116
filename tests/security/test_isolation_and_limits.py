"""Tenant isolation, crafted ids, bearer tokens, input size limits and complete deletion.

- Crafted ids (``:``, ``{``, ``}``, ``/``, ``..``, unicode, 10 kB, NUL) on every route get the
  same 404 as an unknown or foreign conversation and write nothing; every store refuses
  them before touching its backend.
- Bearer tokens are configured and kept only as sha256 digests and compared in constant
  time (every configured digest, ``hmac.compare_digest``); the plaintext token is never
  stored in Redis nor logged.
- Every input has a size limit: body bytes (413), messages per append, characters per
  message, ids, handles, page size, budgets (422/404), never a 5xx.
- DELETE removes the conversation's log, state, history, budget, offloads, lock and queued
  work, and nothing of anyone else's.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.errors import ConfigError
from ctxcore.messages import UserMessage
from ctxcore.state import (
    ConversationKey,
    MemoryMessageLog,
    MemoryStateStore,
)
from ctxcore.state.models import CompressionState
from tests.security.crafted import CRAFTED
from workers.failures import FailureRecord
from workers.http import create_app
from workers.runtime import Runtime
from workers.scheduler import Status
from workers.service import ContextService, InlineQueue

pytestmark = [pytest.mark.security]

DB = 9
TOKEN_A = "tok-A-" + "a" * 30
TOKEN_B = "tok-B-" + "b" * 30
AUTH_A = {"Authorization": f"Bearer {TOKEN_A}"}
AUTH_B = {"Authorization": f"Bearer {TOKEN_B}"}
NOT_FOUND = {"error": "not_found", "detail": "conversation not found"}


class _SchedulerQueue:
    """The fast path's queue on the real scheduler, without Celery (nothing consumes it)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def request(self, key: ConversationKey) -> Status:
        self.rt.scheduler.request(key)
        return self.rt.scheduler.status(key)

    def status(self, key: ConversationKey) -> Status:
        return self.rt.scheduler.status(key)

    def status_from(self, record: FailureRecord) -> Status:
        return "failing" if record.failing else record.scheduler_status


@pytest.fixture()
def make(redis_url: str) -> Iterator[Callable[..., tuple[TestClient, Runtime]]]:
    url = f"{redis_url.rsplit('/', 1)[0]}/{DB}"
    made: list[tuple[TestClient, Runtime, str]] = []

    def build(**overrides: Any) -> tuple[TestClient, Runtime]:
        prefix = f"sec{uuid.uuid4().hex[:8]}"
        data: dict[str, Any] = {
            "redis": {"url": url, "key_prefix": prefix},
            "http": {
                "tokens": {hash_token(TOKEN_A): "tenant-a", hash_token(TOKEN_B): "tenant-b"},
                "requests_per_second": 10_000,
                "burst": 10_000,
            },
        }
        for section, values in overrides.items():
            data.setdefault(section, {}).update(values)
        rt = Runtime(Settings.load(data))
        client = TestClient(create_app(rt, _SchedulerQueue(rt)))
        made.append((client, rt, prefix))
        return client, rt

    yield build
    for client, rt, prefix in made:
        client.close()
        keys = list(rt.redis.scan_iter(match=f"*{prefix}*", count=1000))
        if keys:
            rt.redis.delete(*keys)
        rt.redis.close()


def _keys(rt: Runtime) -> set[str]:
    prefix = rt.settings.redis.key_prefix
    return {k.decode() for k in rt.redis.scan_iter(match=f"*{prefix}*", count=1000)}


def _conversation_keys(rt: Runtime) -> set[str]:
    prefix = "{" + rt.settings.redis.key_prefix
    # Rate buckets, usage and metrics are per tenant / global, not per conversation.
    return {k for k in _keys(rt) if not any(f"{prefix}:{kind}" in k for kind in ("rate", "usage", "metrics"))}


def _routes(conv: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    base = f"/v1/conversations/{conv}"
    return [
        ("POST", f"{base}/messages", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", f"{base}/window", {"budget_tokens": 1000}),
        ("POST", f"{base}/compact", None),
        ("GET", f"{base}/state", None),
        ("GET", f"{base}/state?history=1", None),
        ("GET", f"{base}/offloads/0123456789abcdef", None),
        ("DELETE", base, None),
    ]


@pytest.mark.redis
def test_crafted_ids_on_every_route_are_a_422_or_404_and_write_nothing(make: Callable[..., Any]) -> None:
    client, rt = make()
    # Tenant A owns "shared"; B asks for it: the same 404 as for a crafted id.
    assert (
        client.post(
            "/v1/conversations/shared/messages",
            json={"messages": [{"role": "user", "content": "A's secret plan"}]},
            headers=AUTH_A,
        ).status_code
        == 201
    )
    before = _conversation_keys(rt)
    for method, path, body in _routes("shared")[1:]:
        foreign = client.request(method, path, json=body, headers=AUTH_B)
        assert foreign.status_code == 404 and foreign.json()["error"] == "not_found", (method, path)
        assert "secret plan" not in foreign.text
    for raw in CRAFTED:
        conv = quote(raw, safe="")
        for method, path, body in _routes(conv):
            r = client.request(method, path, json=body, headers=AUTH_A)
            # An encoded "/" or a dot segment may not even reach the route: a 404 in the
            # API's error shape, revealing nothing; an id the route sees is a 422 naming
            # the id rule (no tenant can own it).
            if any(c in raw for c in "/.") and not raw.startswith(".hidden"):
                assert r.status_code == 404, (raw[:20], method, path[:80], r.status_code, r.text[:200])
                assert r.json()["error"] == "not_found", (raw[:20], method, r.text[:200])
                continue
            assert r.status_code == 422, (raw[:20], method, path[:80], r.status_code, r.text[:200])
            assert r.json()["error"] == "invalid_conversation_id", (raw[:20], method, r.text[:200])
            assert "1-128 characters" in r.json()["detail"]
    # A crafted handle on a real conversation, and a crafted paging cursor.
    for handle in ("..", "0123456789ABCDEF", "0123", "g" * 16, "a" * 65, "%2e%2e%2f"):
        r = client.get(f"/v1/conversations/shared/offloads/{quote(handle, safe='%')}", headers=AUTH_A)
        # The client resolves a ".." segment itself (to the conversation's own path,
        # which has no GET): 405, never an offload.
        assert r.status_code == (405 if handle in ("..", "%2e%2e%2f") else 404), handle
        assert r.json()["error"] in ("not_found", "method_not_allowed")
    for after in ("a:b", "{x}", "../x", "x" * 200, "é"):
        assert client.get("/v1/conversations", params={"after": after}, headers=AUTH_A).status_code == 422
    assert _conversation_keys(rt) == before  # nothing written by any of that
    assert client.get("/v1/conversations", headers=AUTH_B).json()["conversations"] == []
    assert client.get("/v1/conversations", headers=AUTH_A).json()["conversations"] == ["shared"]


@pytest.mark.redis
def test_tokens_are_hashes_compared_in_constant_time_and_never_stored(
    make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError):
        Settings.load({"http": {"tokens": {TOKEN_A: "tenant-a"}}})  # a plaintext token is refused
    client, rt = make()
    compared: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(x: Any, y: Any) -> bool:
        compared.append((x, y))
        return real(x, y)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    caplog.set_level(logging.DEBUG)
    digests = set(rt.settings.http.tokens)
    for headers in (AUTH_A, AUTH_B, {"Authorization": "Bearer wrong-token"}):
        compared.clear()
        client.post(
            "/v1/conversations/c1/messages",
            json={"messages": [{"role": "user", "content": "x"}]},
            headers=headers,
        )
        # Every configured digest is compared, whichever matches (or none): no early exit.
        assert {d for _, d in compared} == digests and len(compared) == len(digests)
        assert all(len(x) == 64 for x, _ in compared)  # the token's digest, never the token
    monkeypatch.undo()
    for key in _keys(rt):
        assert TOKEN_A not in key and TOKEN_B not in key
        kind = rt.redis.type(key).decode()
        if kind == "string":
            values = [rt.redis.get(key) or b""]
        elif kind == "hash":
            values = [*rt.redis.hkeys(key), *rt.redis.hvals(key)]
        else:
            values = []
        for value in values:
            assert TOKEN_A.encode() not in value and TOKEN_B.encode() not in value
    assert TOKEN_A not in caplog.text and TOKEN_B not in caplog.text


@pytest.mark.redis
def test_every_input_has_a_size_limit(make: Callable[..., Any]) -> None:
    client, _ = make(
        http={"max_body_bytes": 64 * 1024},
        service={"max_messages_per_append": 10, "max_message_chars": 1000},
    )
    big = "x" * (70 * 1024)
    base = "/v1/conversations/c1"
    client.post(f"{base}/messages", json={"messages": [{"role": "user", "content": "hi"}]}, headers=AUTH_A)
    for path, body in (
        (f"{base}/messages", {"messages": [{"role": "user", "content": big}]}),
        (f"{base}/window", {"budget_tokens": 100, "system_messages": [{"role": "system", "content": big}]}),
        (f"{base}/window", {"budget_tokens": 100, "tools": [{"name": big}]}),
        (f"{base}/compact", {"x": big}),
    ):
        r = client.post(path, json=body, headers=AUTH_A)
        assert r.status_code == 413 and r.json()["error"], path
    # Declared length over the limit: refused before the body is read.
    r = client.post(f"{base}/messages", content=b"{}", headers={**AUTH_A, "Content-Length": str(10**9)})
    assert r.status_code in (400, 413)
    too_many = {"messages": [{"role": "user", "content": "m"}] * 11}
    too_long = {"messages": [{"role": "user", "content": "y" * 1001}]}
    for body in (too_many, too_long):
        r = client.post(f"{base}/messages", json=body, headers=AUTH_A)
        assert r.status_code == 422 and r.json()["error"] == "invalid_message", r.text
    for body in (
        {"budget_tokens": 0},
        {"budget_tokens": -5},
        {"budget_tokens": 10**30},
        {"budget_tokens": 100, "model": "m" * 200},
        {"budget_tokens": 100, "model": "a b"},
        {"budget_tokens": "many"},
    ):
        r = client.post(f"{base}/window", json=body, headers=AUTH_A)
        assert r.status_code == 422, (body, r.status_code, r.text[:200])
    # The model name picks a tokenizer; any number of distinct names costs one counter per
    # encoding, not one per name.
    for n in range(40):
        r = client.post(f"{base}/window", json={"budget_tokens": 500, "model": f"../m{n}"}, headers=AUTH_A)
        assert r.status_code == 200
    service = ContextService(Settings(), MemoryStateStore(), MemoryMessageLog(), None, InlineQueue())
    service.append(ConversationKey("t", "c"), [UserMessage(content="hi")])
    for n in range(40):
        service.get_window(ConversationKey("t", "c"), 500, model=f"gpt-4o-{n}" if n % 2 else f"custom-{n}")
    assert len(service._counters) <= 2
    for params in ({"limit": 0}, {"limit": 1001}, {"after": "a" * 129}):
        assert client.get("/v1/conversations", params=params, headers=AUTH_A).status_code == 422
    r = client.post(
        f"{base}/messages",
        json={"messages": [{"role": "user", "content": "z"}]},
        headers={**AUTH_A, "If-Match": "q" * 10_000},
    )
    assert r.status_code == 409


@pytest.mark.redis
def test_delete_removes_log_state_history_offloads_and_queued_work(make: Callable[..., Any]) -> None:
    client, rt = make(service={"default_budget": 500})
    key = ConversationKey("tenant-a", "doomed")
    keep_a = ConversationKey("tenant-a", "kept")
    keep_b = ConversationKey("tenant-b", "doomed")  # same id, other tenant
    words = " ".join(f"word{i}" for i in range(100))
    for k, headers in ((key, AUTH_A), (keep_a, AUTH_A), (keep_b, AUTH_B)):
        for n in range(4):
            body = {
                "messages": [
                    {"role": "user", "content": f"q{n} {words}"},
                    {"role": "assistant", "content": f"a{n} {words}"},
                ]
            }
            assert client.post(
                f"/v1/conversations/{k.conversation_id}/messages", json=body, headers=headers
            ).status_code in (200, 201)
        # A window over the trigger queues compaction work; the budget is recorded.
        assert (
            client.post(
                f"/v1/conversations/{k.conversation_id}/window", json={"budget_tokens": 1000}, headers=headers
            ).status_code
            == 200
        )
    assert rt.scheduler.status(key) == "queued"
    # Two saved versions (history), and offloads.
    for version in range(2):
        assert rt.state_store.save(key, CompressionState(meta={"n": version}), expected_version=version)
    assert rt.offloads.put_if_absent(key, "0123456789abcdef", [UserMessage(content="original")])
    tag = key.hash_tag
    assert any(tag in k for k in _keys(rt))
    others_before = {k for k in _conversation_keys(rt) if tag not in k and ":sched:" not in k}

    r = client.delete(f"/v1/conversations/{key.conversation_id}", headers=AUTH_A)
    assert r.status_code == 204
    assert not any(tag in k for k in _keys(rt)), sorted(k for k in _keys(rt) if tag in k)
    assert rt.log.read_after(key, None) == [] and rt.log.last_id(key) is None
    assert rt.state_store.load(key) is None and rt.state_store.history(key) == []
    assert rt.state_store.get_budget(key) is None
    assert rt.offloads.get(key, "0123456789abcdef") is None
    assert rt.scheduler.status(key) == "idle"
    ring = rt.scheduler.tags[rt.scheduler.ring_of("tenant-a")]
    queued = rt.redis.lrange(f"{ring}:q:tenant-a", 0, -1)
    assert b"doomed" not in queued and b"kept" in queued
    assert (
        rt.scheduler.next_job() is not None
        and rt.scheduler.next_job() is not None
        and rt.scheduler.next_job() is None
    )
    assert "doomed" not in rt.log.list_conversations("tenant-a")
    assert client.get(f"/v1/conversations/{key.conversation_id}/state", headers=AUTH_A).status_code == 404
    # Nobody else lost anything.
    others_after = {k for k in _conversation_keys(rt) if tag not in k and ":sched:" not in k}
    assert others_after == others_before
    assert len(rt.log.read_after(keep_b, None)) == 8 and len(rt.log.read_after(keep_a, None)) == 8
