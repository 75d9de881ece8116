"""The web inspector (``workers.ui``) over HTTP: sign-in into a session cookie, tenant
isolation, escaping under a script-free CSP, CSRF on rollback, diff, sources, preview."""

from __future__ import annotations

import hashlib
import html
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.tokens import TiktokenCounter
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue
from workers.ui.routes import EXPIRED, LOGIN_BURST
from workers.ui.sessions import COOKIE, SESSION_SECONDS

pytestmark = pytest.mark.redis

TOKEN_A, TOKEN_B = "ui-token-of-acme", "ui-token-of-other"
PLANTED = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>"
BASE = "http://testserver.local"  # the test client's cookie jar keeps cookies of a dotted host


@pytest.fixture()
def ui(redis_url: str) -> Iterator[tuple[TestClient, Runtime, ConversationKey]]:
    prefix = f"ui{uuid.uuid4().hex[:8]}"
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "http": {"tokens": {hash_token(TOKEN_A): "acme", hash_token(TOKEN_B): "other"}},
        }
    )
    runtime = Runtime(settings)
    client = TestClient(create_app(runtime, InlineQueue()), base_url=BASE)
    key = ConversationKey("acme", "conv-1")
    runtime.log.append(
        key,
        [
            UserMessage(content="please list the files"),
            AssistantMessage(content=None, tool_calls=[ToolCall(id="call-1", name="ls")]),
            ToolMessage(content=f"a.txt {PLANTED}", tool_call_id="call-1"),
            AssistantMessage(content="done"),
        ],
    )
    block = SummaryBlock(
        block_id="b1",
        messages=[UserMessage(content=f"summary {PLANTED}")],
        first_id="000000000001",
        last_id="000000000003",
        tokens_before=300,
        tokens_after=40,
    )
    assert runtime.state_store.save(key, CompressionState(covered_until="000000000003", blocks=[block]), 0)
    assert runtime.state_store.save(key, CompressionState(), 1)
    try:
        yield client, runtime, key
    finally:
        client.close()
        runtime.redis.close()
        cleaner = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(cleaner, prefix)
        cleaner.close()


def _sign_in(client: TestClient, token: str = TOKEN_A) -> None:
    r = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert token not in r.headers["location"]


def _csrf(page: str) -> str:
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_sign_in_sessions_and_bad_tokens(ui: Any) -> None:
    client, _, _ = ui
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"
    wrong = client.post("/ui/login", data={"token": "nope"})
    assert wrong.status_code == 401 and COOKIE not in client.cookies
    _sign_in(client)
    page = client.get("/ui/")
    assert page.status_code == 200 and "conv-1" in page.text
    # An unknown session is sent back to sign in like an expired one (Redis cannot tell them apart).
    client.cookies.set(COOKIE, "forged-session", domain="testserver.local", path="/ui")
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login?expired=1"


def test_pages_escape_conversation_content_under_a_script_free_csp(ui: Any) -> None:
    client, runtime, key = ui
    _sign_in(client)
    runtime.state_store.rollback(key, 1, expected_version=2)  # the version with the planted summary
    for url in (
        "/ui/c/conv-1",
        "/ui/c/conv-1/range?first=000000000001&last=000000000003",
        "/ui/c/conv-1/history",
    ):
        page = client.get(url)
        assert page.status_code == 200, url
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp and "frame-ancestors 'none'" in csp
        assert "<script" not in page.text and "<img" not in page.text, url
    page = client.get("/ui/c/conv-1").text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page  # the tool result and the summary, as text
    assert page.count("&lt;script&gt;") >= 2


def test_another_tenants_conversation_is_not_reachable(ui: Any) -> None:
    client, _, _ = ui
    _sign_in(client, TOKEN_B)
    assert "conv-1" not in client.get("/ui/").text
    for url in (
        "/ui/c/conv-1",
        "/ui/c/conv-1/history",
        "/ui/c/conv-1/range?first=000000000001&last=000000000003",
    ):
        page = client.get(url)
        assert page.status_code == 404 and "please list" not in page.text and "a.txt" not in page.text
    unknown = client.get("/ui/c/nobody")
    assert unknown.status_code == 404


def test_rollback_needs_the_csrf_token_and_a_kept_version(ui: Any) -> None:
    client, runtime, key = ui
    _sign_in(client)
    confirm = client.get("/ui/c/conv-1/rollback?version=1")
    assert confirm.status_code == 200 and "roll back to version 1?" in confirm.text
    token = _csrf(confirm.text)
    refused = client.post("/ui/c/conv-1/rollback", data={"version": "1"})
    wrong = client.post("/ui/c/conv-1/rollback", data={"version": "1", "csrf": "guess"})
    assert refused.status_code == wrong.status_code == 403
    assert runtime.state_store.load(key).version == 2 and runtime.journal.entries(key) == []
    gone = client.post("/ui/c/conv-1/rollback", data={"version": "9", "csrf": token})
    assert gone.status_code == 409 and "version 9 is not kept" in gone.text
    assert runtime.state_store.load(key).version == 2
    done = client.post("/ui/c/conv-1/rollback", data={"version": "1", "csrf": token})
    assert done.status_code == 200 and "version 1 restored as version 3" in done.text
    assert runtime.state_store.load(key).version == 3
    assert runtime.journal.entries(key)[0].outcome == "rolled_back"


def test_diff_sources_preview_and_sign_out(ui: Any) -> None:
    client, runtime, key = ui
    _sign_in(client)
    diff = client.get("/ui/c/conv-1/diff?a=1&b=2")
    assert diff.status_code == 200 and "1 only in 1, 0 only in 2" in diff.text
    same = client.get("/ui/c/conv-1/diff?a=2&b=2")
    assert "compared with itself: nothing differs" in same.text
    assert client.get("/ui/c/conv-1/diff?a=1&b=77").status_code == 404
    sources = client.get("/ui/c/conv-1/range?first=000000000001&last=000000000003")
    assert "please list the files" in sources.text and "[tool call ls call-1]" in sources.text
    for budget in (50, 500, 5000):
        assert client.get(f"/ui/c/conv-1?budget={budget}").status_code == 200
    assert runtime.state_store.get_budget(key) is None  # the inspector's preview records nothing
    page = client.get("/ui/")
    assert client.post("/ui/logout", data={}).status_code == 403  # no CSRF token: still signed in
    out = client.post("/ui/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
    assert out.status_code == 303 and client.get("/ui/", follow_redirects=False).status_code == 303


def test_offloads_the_rules_cleared_link_to_their_originals(ui: Any) -> None:
    client, runtime, _ = ui
    key = ConversationKey("acme", "tools")
    # One request worked through in many steps: its older results are what the rules clear
    # (answered requests of their own would be left out whole first).
    runtime.log.append(key, [UserMessage(content="read every file")])
    for i in range(20):
        runtime.log.append(
            key,
            [
                AssistantMessage(content=None, tool_calls=[ToolCall(id=f"c{i}", name="cat")]),
                ToolMessage(content=f"file {i} {PLANTED} " + "line of output\n" * 120, tool_call_id=f"c{i}"),
                AssistantMessage(content=f"read {i}"),
            ],
        )
    _sign_in(client)
    page = client.get("/ui/c/tools?budget=6000").text
    assert 'id="cleared"' in page, "the rules cleared nothing at this budget"
    link = page.split('class="offload" href="', 1)[1].split('"', 1)[0]
    original = client.get(link)
    assert original.status_code == 200 and "line of output" in original.text
    assert "&lt;script&gt;" in original.text and "<script" not in original.text
    assert client.get("/ui/c/tools/offload/0123456789abcdef").status_code == 404
    assert client.get("/ui/c/tools/offload/not-a-handle").status_code == 404
    assert runtime.state_store.get_budget(key) is None


@pytest.mark.parametrize("store", ["redis", "sqlite"])
def test_the_list_shows_stored_tokens_and_last_activity(redis_url: str, store: str, tmp_path: Path) -> None:
    prefix = f"ui{uuid.uuid4().hex[:8]}"
    # Redis keeps the activity stamp with a retention; SQL stamps its counter row always.
    stores = {"service": {"retention_days": 1}} if store == "redis" else {}
    if store == "sqlite":
        stores["database"] = {"url": f"sqlite:///{tmp_path / 'ui.db'}"}
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "http": {"tokens": {hash_token(TOKEN_A): "acme"}},
            **stores,
        }
    )
    runtime = Runtime(settings)
    client = TestClient(create_app(runtime, InlineQueue()), base_url=BASE)
    try:
        messages = [{"role": "user", "content": f"question {i} " + "word " * 40} for i in range(30)]
        auth = {"Authorization": f"Bearer {TOKEN_A}"}
        r = client.post("/v1/conversations/counted/messages", json={"messages": messages}, headers=auth)
        assert r.status_code in (200, 201), r.text
        runtime.log.append(ConversationKey("acme", "plain"), [UserMessage(content="logged without counts")])
        key = ConversationKey("acme", "counted")
        counter = TiktokenCounter(settings.engine.tokenizer_model)
        expected = sum(counter.count_message(m) for m in runtime.log.read_after(key, None))
        _sign_in(client)
        page = client.get("/ui/").text
        counted = page.split('href="/ui/c/counted"', 1)[1].split("</tr>", 1)[0]
        assert f'<td class="tokens">{expected:,}</td>' in counted
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert f'<td class="active">{today} ' in counted and " UTC</td>" in counted
        plain = page.split('href="/ui/c/plain"', 1)[1].split("</tr>", 1)[0]
        assert '<td class="tokens">not counted</td>' in plain
    finally:
        client.close()
        runtime.redis.close()
        cleaner = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(cleaner, prefix)
        cleaner.close()


@contextmanager
def _app(
    redis_url: str, http: dict[str, Any], address: str = "10.0.0.1"
) -> Iterator[tuple[TestClient, Runtime]]:
    prefix = f"ui{uuid.uuid4().hex[:8]}"
    tokens = {hash_token(TOKEN_A): "acme", hash_token(TOKEN_B): "other"}
    settings = Settings.load(
        {"redis": {"url": redis_url, "key_prefix": prefix}, "http": {"tokens": tokens, **http}}
    )
    runtime = Runtime(settings)
    client = TestClient(create_app(runtime, InlineQueue()), base_url=BASE, client=(address, 5000))
    try:
        yield client, runtime
    finally:
        client.close()
        runtime.redis.close()
        cleaner = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(cleaner, prefix)
        cleaner.close()


def _session_key(client: TestClient, runtime: Runtime) -> str:
    digest = hashlib.sha256(client.cookies[COOKIE].encode()).hexdigest()
    return f"{runtime.settings.redis.key_prefix}:ui:session:{digest}"


def _sent_back_as_expired(client: TestClient) -> None:
    r = client.get("/ui/c/conv-1/history", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?expired=1"
    assert f"{COOKIE}=" in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    page = client.get(r.headers["location"])
    assert page.status_code == 200 and html.escape(EXPIRED) in page.text


def test_an_expired_session_is_sent_back_to_sign_in_saying_so(ui: Any) -> None:
    client, runtime, key = ui
    _sign_in(client)
    assert client.get("/ui/c/conv-1/history").status_code == 200
    # 1. Redis dropped it: its TTL ran out.
    name = _session_key(client, runtime)
    assert 0 < runtime.redis.ttl(name) <= SESSION_SECONDS
    runtime.redis.pexpire(name, 1)
    time.sleep(0.05)
    _sent_back_as_expired(client)
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"  # cookie gone
    # 2. Its stored expiry has passed (the key itself still there, say its TTL was lost).
    _sign_in(client)
    name = _session_key(client, runtime)
    stored = json.loads(runtime.redis.get(name))
    runtime.redis.set(name, json.dumps({**stored, "expires": time.time() - 1}))  # no TTL now
    _sent_back_as_expired(client)
    assert runtime.redis.exists(name) == 0  # the stale session is deleted, not only refused
    # 3. A rollback posted from a page whose session expired changes nothing.
    _sign_in(client)
    token = _csrf(client.get("/ui/c/conv-1/rollback?version=1").text)
    runtime.redis.delete(_session_key(client, runtime))
    r = client.post("/ui/c/conv-1/rollback", data={"version": "1", "csrf": token})
    assert r.status_code == 401 and html.escape(EXPIRED) in r.text
    assert runtime.state_store.load(key).version == 2 and runtime.journal.entries(key) == []


def test_ui_pages_count_against_the_tenants_request_rate(redis_url: str) -> None:
    with _app(redis_url, {"requests_per_second": 0.01, "burst": 3}) as (client, runtime):
        runtime.log.append(ConversationKey("acme", "conv-1"), [UserMessage(content="hello")])
        _sign_in(client)  # signing in is not a tenant request: its address's bucket pays
        assert client.get("/ui/").status_code == 200
        assert client.get("/ui/c/conv-1").status_code == 200
        auth = {"Authorization": f"Bearer {TOKEN_A}"}
        assert client.get("/v1/conversations", headers=auth).status_code == 200  # the third: same bucket
        refused = client.get("/ui/c/conv-1")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "more than 0.01 requests per second" in refused.text and "hello" not in refused.text
        assert "default-src 'none'" in refused.headers["content-security-policy"]
        assert client.get("/v1/conversations", headers=auth).status_code == 429  # the API's too
        # Another tenant's bucket is its own.
        other = TestClient(client.app, base_url=BASE, client=("10.0.0.9", 5000))
        _sign_in(other, TOKEN_B)
        assert other.get("/ui/").status_code == 200
        other.close()


def test_sign_in_attempts_are_limited_per_client_address(redis_url: str) -> None:
    with _app(redis_url, {}) as (client, _):
        for _ in range(LOGIN_BURST):
            assert client.post("/ui/login", data={"token": "guess"}).status_code == 401
        refused = client.post("/ui/login", data={"token": "guess"})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "too many sign-in attempts" in refused.text
        right = client.post("/ui/login", data={"token": TOKEN_A}, follow_redirects=False)
        assert right.status_code == 429 and COOKIE not in client.cookies  # even the right token waits
        # Another address has its own bucket.
        elsewhere = TestClient(client.app, base_url=BASE, client=("10.0.0.2", 5000))
        _sign_in(elsewhere)
        elsewhere.close()
