"""The HTTP API (workers/http/) against a real Redis, with an ``InlineQueue`` instead of Celery
(the rate limiter also with its buckets on the session's Redis Cluster)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.messages import SystemMessage, UserMessage, from_openai
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window
from tests.datasets import conversations
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = pytest.mark.redis

TOKEN_A = "secret-token-of-tenant-a"
TOKEN_B = "secret-token-of-tenant-b"
AUTH_A = {"Authorization": f"Bearer {TOKEN_A}"}
AUTH_B = {"Authorization": f"Bearer {TOKEN_B}"}
CONV = "/v1/conversations"


class Api:
    """A test client plus the runtime and queue behind it."""

    def __init__(self, client: TestClient, runtime: Runtime, queue: InlineQueue) -> None:
        self.client = client
        self.runtime = runtime
        self.queue = queue

    def append(self, conv: str, messages: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
        return self.client.post(
            f"{CONV}/{conv}/messages", json={"messages": messages}, headers=headers or AUTH_A
        )


def _settings(url: str, prefix: str, **overrides: Any) -> Settings:
    data: dict[str, Any] = {
        "redis": {"url": url, "key_prefix": prefix},
        "http": {"tokens": {hash_token(TOKEN_A): "tenant-a", hash_token(TOKEN_B): "tenant-b"}},
    }
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return Settings.load(data)


@pytest.fixture()
def make_api(redis_url: str) -> Iterator[Callable[..., Api]]:
    """Build an API over the test Redis with a key prefix of its own (its keys are deleted
    afterwards, nothing else is); ``overrides`` are settings sections."""
    made: list[tuple[TestClient, Runtime]] = []

    def make(url: str | None = None, **overrides: Any) -> Api:
        settings = _settings(url or redis_url, f"http{uuid.uuid4().hex[:8]}", **overrides)
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


def _user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def _assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


# --- auth and isolation ------------------------------------------------------------------


def test_auth_missing_wrong_and_right_token(api: Api) -> None:
    missing = api.client.post(f"{CONV}/c1/messages", json={"messages": [_user("hi")]})
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert missing.json()["error"] == "unauthorized"

    for header in ("Bearer not-a-configured-token", f"Basic {TOKEN_A}", "Bearer", TOKEN_A):
        wrong = api.client.post(
            f"{CONV}/c1/messages", json={"messages": [_user("hi")]}, headers={"Authorization": header}
        )
        assert wrong.status_code == 401, header
        assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
    # A configured digest used as the token itself must not authenticate.
    digest = {"Authorization": f"Bearer {hash_token(TOKEN_A)}"}
    assert api.client.get(CONV, headers=digest).status_code == 401

    right = api.append("c1", [_user("hi")])
    assert right.status_code == 201
    assert right.json() == {"ids": ["000000000001"], "last_id": "000000000001"}
    assert right.headers["ETag"] == '"000000000001"'
    # Unauthenticated operational routes.
    assert api.client.get("/healthz").json() == {"status": "ok"}


def test_another_tenants_conversation_is_exactly_a_missing_one(api: Api) -> None:
    assert api.append("shared-name", [_user("tenant A's task"), _assistant("ok")]).status_code == 201
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
    assert api.append("shared-name", [_user("B's own")], headers=AUTH_B).json()["ids"] == ["000000000001"]
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


# --- appends -----------------------------------------------------------------------------


def test_if_match_mismatch_is_409(api: Api) -> None:
    first = api.append("c1", [_user("one")]).json()
    stale = api.append("c1", [_assistant("two")], headers={**AUTH_A, "If-Match": '"000000000009"'})
    assert stale.status_code == 409
    assert stale.json()["error"] == "conflict"
    assert stale.json()["last_id"] == first["last_id"]
    assert api.runtime.log.last_id(ConversationKey("tenant-a", "c1")) == first["last_id"]

    ok = api.append("c1", [_assistant("two")], headers={**AUTH_A, "If-Match": f'"{first["last_id"]}"'})
    assert ok.status_code == 201 and ok.json()["last_id"] == "000000000002"
    bare = api.append("c1", [_user("three")], headers={**AUTH_A, "If-Match": "000000000002"})
    assert bare.status_code == 201
    star = api.append("c1", [_assistant("four")], headers={**AUTH_A, "If-Match": "*"})
    assert star.status_code == 201
    # If-Match on a conversation that does not exist cannot hold.
    assert api.append("new", [_user("x")], headers={**AUTH_A, "If-Match": "000000000001"}).status_code == 409
    assert api.append("new", [_user("x")], headers={**AUTH_A, "If-Match": "*"}).status_code == 409


def test_16_concurrent_appends_with_one_if_match_one_wins(api: Api) -> None:
    first = api.append("c1", [_user("task")]).json()["last_id"]
    clients = [TestClient(api.client.app) for _ in range(16)]
    barrier = threading.Barrier(len(clients))
    responses: dict[int, Any] = {}

    def post(index: int) -> None:
        barrier.wait()
        responses[index] = clients[index].post(
            f"{CONV}/c1/messages",
            json={"messages": [_assistant(f"writer {index}", message_id=f"w{index}")]},
            headers={**AUTH_A, "If-Match": f'"{first}"'},
        )

    pool = [threading.Thread(target=post, args=(i,)) for i in range(len(clients))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    codes = sorted(r.status_code for r in responses.values())
    assert codes == [201] + [409] * 15
    winner = next(i for i, r in responses.items() if r.status_code == 201)
    for r in responses.values():
        if r.status_code == 409:
            assert r.json()["error"] == "conflict" and r.json()["last_id"] == "000000000002"
            assert r.headers["ETag"] == '"000000000002"'
    # The winner's retry after a lost response: 200, the same ids, nothing written twice
    retry = clients[winner].post(
        f"{CONV}/c1/messages",
        json={"messages": [_assistant(f"writer {winner}", message_id=f"w{winner}")]},
        headers={**AUTH_A, "If-Match": f'"{first}"'},
    )
    assert retry.status_code == 200 and retry.json() == responses[winner].json()
    assert retry.headers["ETag"] == '"000000000002"'
    assert len(api.runtime.log.read_after(ConversationKey("tenant-a", "c1"), None)) == 2
    for client in clients:
        client.close()


def test_interrupted_call_is_accepted_and_closed_but_a_late_result_is_422(api: Api) -> None:
    call = {"id": "cancel-1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    shape = [_user("run it"), _assistant("", tool_calls=[call]), _user("never mind"), _assistant("ok")]
    assert api.append("c1", shape).status_code == 201
    window = api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 2000}, headers=AUTH_A).json()
    roles = [m["role"] for m in window["messages"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    closed = window["messages"][2]
    assert closed["tool_call_id"] == "cancel-1" and closed["content"] == "[Tool execution interrupted]"
    assert check_window(from_openai(window["messages"])) == []
    # The log keeps the raw shape; a late result for the interrupted call is rejected
    assert len(api.runtime.log.read_after(ConversationKey("tenant-a", "c1"), None)) == 4
    late = api.append("c1", [{"role": "tool", "tool_call_id": "cancel-1", "content": "done"}])
    assert late.status_code == 422 and late.json()["field"] == "orphan_tool_result"
    # A call followed by another assistant message (no user in between) stays a 422
    other = api.append("c2", [_user("go"), _assistant("", tool_calls=[call]), _assistant("moving on")])
    assert other.status_code == 422 and other.json()["field"] == "missing_tool_result"
    # An interrupted call followed by a user message is accepted in a later batch too
    assert api.append("c3", [_user("go"), _assistant("", tool_calls=[call])]).status_code == 201
    assert api.append("c3", [_user("stop")]).status_code == 201


def test_unservable_state_is_409_invalid_window(api: Api) -> None:
    api.append("c1", [_user("task"), _assistant("a"), _user("intent"), _assistant("b")])
    key = ConversationKey("tenant-a", "c1")
    # A state written by a buggy summariser: its block carries an orphan tool result
    bad = CompressionState(
        blocks=[
            SummaryBlock(
                block_id="b1",
                first_id="000000000002",
                last_id="000000000002",
                messages=from_openai([{"role": "tool", "tool_call_id": "other", "content": "x"}]),
            )
        ],
        covered_until="000000000002",
        pinned=["000000000001"],
    )
    assert api.runtime.state_store.save(key, bad, expected_version=0)
    r = api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 2000}, headers=AUTH_A)
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "invalid_window" and body["state_version"] == 1
    assert body["violations"][0]["rule"] == "orphan_tool_result" and "roll" in body["detail"]


def test_idempotent_append_by_message_id(api: Api) -> None:
    batch = [_user("question", message_id="m-1"), _assistant("answer", message_id="m-2")]
    first = api.append("c1", batch)
    assert first.status_code == 201
    again = api.append("c1", batch)
    assert again.status_code == 200  # a replay: nothing new was appended
    assert again.json() == first.json()
    mixed = api.append("c1", [batch[1], _user("follow-up", message_id="m-3")])
    assert mixed.status_code == 201
    assert mixed.json()["ids"] == [first.json()["ids"][1], "000000000003"]
    assert len(api.runtime.log.read_after(ConversationKey("tenant-a", "c1"), None)) == 3


def test_invalid_messages_are_422_naming_the_index(api: Api) -> None:
    bad_role = api.append("c1", [_user("fine"), {"role": "wizard", "content": "x"}])
    assert bad_role.status_code == 422
    body = bad_role.json()
    assert body["error"] == "invalid_message"
    assert (body["index"], body["field"], body["location"]) == (1, "role", "messages")

    not_object = api.append("c1", [_user("fine"), _assistant("ok"), "just a string"])
    assert not_object.status_code == 422 and not_object.json()["index"] == 2

    system = api.append("c1", [{"role": "system", "content": "be nice"}])
    assert system.status_code == 422
    assert (system.json()["index"], system.json()["field"]) == (0, "role")

    orphan = api.append("c1", [_user("go"), {"role": "tool", "tool_call_id": "nope", "content": "r"}])
    assert orphan.status_code == 422 and orphan.json()["error"] == "invalid_message"

    # Nothing of a rejected batch was written: the conversation does not exist.
    assert api.client.get(f"{CONV}/c1/state", headers=AUTH_A).status_code == 404

    malformed = api.client.post(f"{CONV}/c1/messages", json={"msgs": []}, headers=AUTH_A)
    assert malformed.status_code == 422 and malformed.json()["error"] == "invalid_request"
    not_json = api.client.post(
        f"{CONV}/c1/messages", content=b"{not json", headers={**AUTH_A, "Content-Type": "application/json"}
    )
    assert not_json.status_code == 422


def test_window_422s_budget_exceeded_and_bad_system_messages(api: Api) -> None:
    api.append("c1", [_user("a task that has to fit " * 20), _assistant("ok")])
    window = f"{CONV}/c1/window"
    exceeded = api.client.post(
        window,
        json={"budget_tokens": 50, "system_messages": [{"role": "system", "content": "rules " * 30}]},
        headers=AUTH_A,
    )
    assert exceeded.status_code == 422
    body = exceeded.json()
    assert body["error"] == "budget_exceeded" and body["budget"] == 50
    assert body["system_tokens"] > 0 and body["anchor_tokens"] > 0 and body["tools_tokens"] == 0

    not_system = api.client.post(
        window, json={"budget_tokens": 1000, "system_messages": [_user("hi")]}, headers=AUTH_A
    )
    assert not_system.status_code == 422
    assert not_system.json()["location"] == "system_messages" and not_system.json()["index"] == 0
    for budget in (0, -5, "lots"):
        assert api.client.post(window, json={"budget_tokens": budget}, headers=AUTH_A).status_code == 422
    bad_model = api.client.post(window, json={"budget_tokens": 1000, "model": "x" * 500}, headers=AUTH_A)
    assert bad_model.status_code == 422


def test_conversation_limit_per_tenant(make_api: Callable[..., Api]) -> None:
    api = make_api(tenants={"tenant-a": {"max_conversations": 2}})
    assert api.append("c1", [_user("1")]).status_code == 201
    assert api.append("c2", [_user("2")]).status_code == 201
    third = api.append("c3", [_user("3")])
    assert third.status_code == 403 and third.json()["error"] == "conversation_limit"
    assert api.append("c1", [_assistant("still fine")]).status_code == 201  # existing conversation
    assert api.append("c3", [_user("3")], headers=AUTH_B).status_code == 201  # other tenant
    assert api.client.delete(f"{CONV}/c2", headers=AUTH_A).status_code == 204
    assert api.append("c3", [_user("3")]).status_code == 201


# --- limits ------------------------------------------------------------------------------


def test_oversized_bodies_are_413_before_parsing(make_api: Callable[..., Api]) -> None:
    api = make_api(http={"max_body_bytes": 2000})
    big = {"messages": [_user("x" * 5000)]}
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


# --- reads, windows, deletes -------------------------------------------------------------


def test_window_on_a_tau_bench_conversation_fits_the_budget(api: Api) -> None:
    record = max(
        conversations("tau_bench.jsonl"), key=lambda c: len(c["messages"])
    )  # 48 messages, 6.4K tokens
    system = [m for m in record["messages"] if m["role"] == "system"]
    rest = [m for m in record["messages"] if m["role"] != "system"]
    appended = api.append("tau", rest)
    assert appended.status_code == 201, appended.text
    assert len(appended.json()["ids"]) == len(rest)

    budget = 4000
    r = api.client.post(
        f"{CONV}/tau/window", json={"budget_tokens": budget, "system_messages": system}, headers=AUTH_A
    )
    assert r.status_code == 200, r.text
    body = r.json()
    served = from_openai(body["messages"])
    assert isinstance(served[0], SystemMessage)
    assert check_window(served) == []
    counter = TiktokenCounter()
    assert counter.count_messages(served) <= budget
    assert body["stats"]["total_tokens"] <= budget
    assert len(body["stats"]) == 13
    assert body["compaction"] == "queued" and api.queue.requests == [ConversationKey("tenant-a", "tau")]
    # Both anchors are served verbatim, with their log ids.
    logged = api.runtime.log.read_after(ConversationKey("tenant-a", "tau"), None)
    served_ids = {m.context_message_id for m in served}
    for index in anchors(logged).indices():
        assert logged[index].context_message_id in served_ids
    # The conversation really is over the budget: the window had to shrink it (rules and,
    # with no worker compacting, maybe the fallback).
    assert counter.count_messages(from_openai(record["messages"])) > budget
    assert isinstance(body["fallback_applied"], bool)

    compact = api.client.post(f"{CONV}/tau/compact", headers=AUTH_A)
    assert compact.status_code == 202 and compact.json() == {"status": "queued"}


def _block(block_id: str, first: str, last: str, text: str) -> SummaryBlock:
    return SummaryBlock(
        block_id=block_id,
        messages=[UserMessage(content=text)],
        first_id=first,
        last_id=last,
        tokens_before=100,
        tokens_after=10,
        model="extractive",
    )


def test_state_with_provenance_and_history(api: Api) -> None:
    api.append("c1", [_user("task"), _assistant("step 1"), _user("more"), _assistant("step 2")])
    empty = api.client.get(f"{CONV}/c1/state", headers=AUTH_A)
    assert empty.status_code == 200
    assert empty.json() == {
        "version": 0,
        "covered_until": None,
        "pinned": [],
        "blocks": [],
        "budget": None,
        "compaction": "idle",
        "compaction_detail": {"last_error": None, "last_success_at": None, "reason": None, "hold": None},
    }

    key = ConversationKey("tenant-a", "c1")
    store = api.runtime.state_store
    v1 = CompressionState(blocks=[_block("B1", "000000000002", "000000000002", "summary one")])
    assert store.save(
        key, v1.model_copy(update={"covered_until": "000000000002", "pinned": ["000000000001"]}), 0
    )
    v2 = CompressionState(
        blocks=[_block("B2", "000000000002", "000000000004", "summary two")],
        covered_until="000000000004",
        pinned=["000000000001", "000000000003"],
    )
    assert store.save(key, v2, 1)
    api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 5000}, headers=AUTH_A)

    current = api.client.get(f"{CONV}/c1/state", headers=AUTH_A).json()
    assert "history" not in current
    assert current["version"] == 2 and current["budget"] == 5000
    assert current["covered_until"] == "000000000004"
    assert current["pinned"] == ["000000000001", "000000000003"]
    (block,) = current["blocks"]
    assert {k: block[k] for k in ("block_id", "first_id", "last_id", "level", "text", "model")} == {
        "block_id": "B2",
        "first_id": "000000000002",
        "last_id": "000000000004",
        "level": 1,
        "text": "summary two",
        "model": "extractive",
    }
    assert block["tokens_before"] == 100 and block["tokens_after"] == 10 and block["created_at"]

    with_history = api.client.get(f"{CONV}/c1/state?history=1", headers=AUTH_A).json()
    assert [s["version"] for s in with_history["history"]] == [2, 1]
    assert with_history["history"][1]["blocks"][0]["block_id"] == "B1"


def test_offload_is_returned_in_openai_format_or_404(api: Api) -> None:
    api.append("c1", [_user("task")])
    key = ConversationKey("tenant-a", "c1")
    handle = "0123456789abcdef"
    original = from_openai(
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "call-1", "function": {"name": "ls", "arguments": "{}"}}],
            }
        ]
    )
    api.runtime.offloads.put_if_absent(key, handle, original)
    r = api.client.get(f"{CONV}/c1/offloads/{handle}", headers=AUTH_A)
    assert r.status_code == 200
    assert r.json()["handle"] == handle
    assert r.json()["messages"][0]["tool_calls"][0]["function"]["name"] == "ls"
    for bad in ("0123456789abcdee", "0123456789ABCDEF", "NOT-HEX", "abc"):
        assert api.client.get(f"{CONV}/c1/offloads/{bad}", headers=AUTH_A).status_code == 404, bad


def test_delete_removes_everything_then_404(api: Api) -> None:
    api.append("doomed", [_user("task"), _assistant("done")])
    api.append("kept", [_user("other task")])
    key = ConversationKey("tenant-a", "doomed")
    rt = api.runtime
    handle = "aaaaaaaabbbbbbbb"
    rt.offloads.put_if_absent(key, handle, [UserMessage(content="big")])
    assert rt.state_store.save(
        key, CompressionState(covered_until="000000000001", pinned=["000000000001"]), 0
    )
    assert rt.scheduler.request(key)
    assert rt.scheduler.status(key) == "queued"

    assert api.client.delete(f"{CONV}/doomed", headers=AUTH_A).status_code == 204
    assert rt.log.last_id(key) is None and rt.log.read_after(key, None) == []
    assert rt.state_store.load(key) is None and rt.state_store.history(key) == []
    assert rt.offloads.get(key, handle) is None
    assert rt.scheduler.status(key) == "idle" and rt.scheduler.depth() == 0

    for method, path in [
        ("GET", f"{CONV}/doomed/state"),
        ("POST", f"{CONV}/doomed/compact"),
        ("DELETE", f"{CONV}/doomed"),
        ("GET", f"{CONV}/doomed/offloads/{handle}"),
    ]:
        assert api.client.request(method, path, headers=AUTH_A).status_code == 404, (method, path)
    assert api.client.get(CONV, headers=AUTH_A).json()["conversations"] == ["kept"]
    # The id can be used again, from scratch.
    assert api.append("doomed", [_user("again")]).json()["ids"] == ["000000000001"]


def test_delete_waits_for_a_running_stage_then_409(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.delete
    from workers.locks import conversation_lock

    api.append("busy", [_user("task")])
    key = ConversationKey("tenant-a", "busy")
    monkeypatch.setattr(workers.delete, "DELETE_LOCK_WAIT_SECONDS", 0.2)
    with conversation_lock(api.runtime.redis, api.runtime.settings.redis.key_prefix, key, timeout=10):
        r = api.client.delete(f"{CONV}/busy", headers=AUTH_A)
    assert r.status_code == 409 and r.json()["error"] == "conversation_busy"
    assert r.headers["Retry-After"] == "1"
    assert api.runtime.log.last_id(key) == "000000000001"  # nothing was deleted
    assert api.client.delete(f"{CONV}/busy", headers=AUTH_A).status_code == 204


def test_list_is_paged(api: Api) -> None:
    names = [f"conv-{i}" for i in range(5)]
    for name in names:
        api.append(name, [_user("hi")])
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = api.client.get(CONV, params=params, headers=AUTH_A).json()
        seen += page["conversations"]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert seen == names and pages == 3
    assert api.client.get(CONV, params={"limit": 1000}, headers=AUTH_A).json() == {
        "conversations": names,
        "next": None,
    }
    for params in ({"limit": 0}, {"limit": 1001}, {"after": ".bad"}):
        assert api.client.get(CONV, params=params, headers=AUTH_A).status_code == 422, params


def test_usage_is_per_tenant(api: Api) -> None:
    api.runtime.usage.add("tenant-a", 3, 1200, 300)
    usage = api.client.get("/v1/usage", headers=AUTH_A).json()
    assert usage == {
        "tenant": "tenant-a",
        "calls": 3,
        "input_tokens": 1200,
        "output_tokens": 300,
        "day": usage["day"],
        "summariser_tokens_today": 0,
        "summariser_tokens_per_day": None,
    }
    assert api.client.get("/v1/usage", headers=AUTH_B).json()["calls"] == 0


def _sample(text: str, series: str) -> float:
    """The value of one exposition line (0 when absent)."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return 0.0


def test_metrics_and_healthz(api: Api) -> None:
    api.append("c1", [_user("task"), _assistant("answer")])
    before = api.client.get("/metrics").text
    assert (
        api.client.post(f"{CONV}/c1/window", json={"budget_tokens": 1000}, headers=AUTH_A).status_code == 200
    )
    assert (
        api.client.post(f"{CONV}/nope/window", json={"budget_tokens": 1000}, headers=AUTH_A).status_code
        == 404
    )
    r = api.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "version=0.0.4" in r.headers["content-type"]
    text = r.text
    assert "# TYPE ctxcore_fast_path_seconds histogram" in text
    assert "# TYPE ctxcore_window_request_seconds histogram" in text
    fast = 'ctxcore_fast_path_seconds_count{fallback="false",route="window"}'
    assert _sample(text, fast) == _sample(before, fast) + 1
    assert _sample(text, 'ctxcore_fast_path_seconds_bucket{fallback="false",le="+Inf",route="window"}') == 1
    assert _sample(text, 'ctxcore_window_request_seconds_count{status="200"}') == 1
    assert _sample(text, 'ctxcore_windows_total{status="200"}') == 1
    assert _sample(text, 'ctxcore_windows_total{status="404"}') == 1
    assert _sample(text, 'ctxcore_appends_total{status="201"}') == 1
    assert _sample(text, 'ctxcore_errors_total{status="404"}') == 1
    assert _sample(text, "ctxcore_queue_depth") == 0 and "ctxcore_queue_depth 0.0" in text
    # Stage series are served by the worker nodes, not here.
    assert "ctxcore_stage_seconds" not in text
    assert "tenant-a" not in text and "c1" not in text and "nope" not in text  # no unbounded labels
    assert api.client.get("/healthz").status_code == 200


def test_store_outage_is_503_with_retry_after(make_api: Callable[..., Api]) -> None:
    api = make_api(url="redis://127.0.0.1:1/0")
    for method, path, body in [
        ("POST", f"{CONV}/c1/messages", {"messages": [_user("hi")]}),
        ("POST", f"{CONV}/c1/window", {"budget_tokens": 1000}),
        ("GET", CONV, None),
        ("GET", "/v1/usage", None),
        ("GET", "/metrics", None),
    ]:
        r = api.client.request(method, path, json=body, headers=AUTH_A)
        assert r.status_code == 503, (method, path, r.text)
        assert r.headers["Retry-After"] == "1"
        if path != "/metrics":
            assert "127.0.0.1:1" not in r.text  # no internals in the body
    health = api.client.get("/healthz")
    assert health.status_code == 503 and health.json() == {"status": "unavailable"}
    # Authentication needs no store: a bad token is still a 401.
    assert api.client.get(CONV, headers={"Authorization": "Bearer nope"}).status_code == 401


# --- OpenAPI -----------------------------------------------------------------------------


def test_openapi_document_is_valid_and_complete(api: Api) -> None:
    r = api.client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    try:
        from openapi_spec_validator import validate
    except ImportError:  # pragma: no cover - the dev extra installs it
        assert doc["openapi"].startswith("3.")
    else:
        validate(doc)

    paths = doc["paths"]
    expected = {
        ("post", "/v1/conversations/{conversation_id}/messages"): "AppendRequest",
        ("post", "/v1/conversations/{conversation_id}/window"): "WindowRequest",
        ("post", "/v1/conversations/{conversation_id}/compact"): None,
        ("get", "/v1/conversations/{conversation_id}/state"): None,
        ("get", "/v1/conversations/{conversation_id}/offloads/{handle}"): None,
        ("get", "/v1/conversations"): None,
        ("delete", "/v1/conversations/{conversation_id}"): None,
        ("get", "/v1/usage"): None,
        ("get", "/healthz"): None,
        ("get", "/metrics"): None,
    }
    for (method, path), request_model in expected.items():
        op = paths[path][method]
        if request_model:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith(f"/{request_model}")
        success = next(code for code in op["responses"] if code.startswith("2"))
        if method != "delete":
            assert op["responses"][success].get("content"), (method, path)
        if path.startswith("/v1/"):
            assert op["security"] == [{"HTTPBearer": []}]
            assert "401" in op["responses"] and "429" in op["responses"]
    schemas = doc["components"]["schemas"]
    for name in ("AppendResponse", "WindowResponse", "StateResponse", "ConversationList", "ErrorBody"):
        assert name in schemas
    assert set(schemas["WindowStats"]["properties"]) >= {"total_tokens", "tool_tokens", "total_dialogues"}
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_a_window_without_a_budget_uses_the_tenants_default(make_api: Callable[..., Api]) -> None:
    api = make_api(service={"default_budget": 5000}, tenants={"tenant-b": {"default_budget": 900}})
    for auth, conv in ((AUTH_A, "d1"), (AUTH_B, "d2")):
        api.client.post(
            f"{CONV}/{conv}/messages",
            json={
                "messages": [
                    _user("fix the parser " * 100),
                    _assistant("on it " * 300),
                    _user("and the tests " * 100),
                    _assistant("done " * 300),
                ]
            },
            headers=auth,
        )
    wide = api.client.post(f"{CONV}/d1/window", json={}, headers=AUTH_A)
    narrow = api.client.post(f"{CONV}/d2/window", json={}, headers=AUTH_B)
    assert wide.status_code == 200 and narrow.status_code == 200, (wide.text, narrow.text)
    assert wide.json()["stats"]["total_tokens"] <= 5000
    assert narrow.json()["stats"]["total_tokens"] <= 900
    # The default is the conversation's budget from then on, as an explicit one would be.
    assert api.runtime.state_store.get_budget(ConversationKey("tenant-a", "d1")) == 5000
    assert api.runtime.state_store.get_budget(ConversationKey("tenant-b", "d2")) == 900
