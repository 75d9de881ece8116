"""``GET .../journal`` and ``POST .../rollback`` over a live API, raw and through the Python
clients (sync and async): tenant isolation, 404 for unknown and deleted conversations, a
rollback to a version no longer kept changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from ctxcore.client import AsyncCtxcoreClient, CtxcoreClient
from ctxcore.errors import NotFoundError, VersionNotKept
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.state.journal import JournalEntry
from tests.live_server import SLOW_TOKEN, TOKEN, LiveApi, serve_api

pytestmark = pytest.mark.redis

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONV = "/v1/conversations"


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[LiveApi]:
    api = serve_api(redis_url, worker=False)
    try:
        yield api
    finally:
        api.close()


def _conversation(live: LiveApi, versions: int = 0) -> tuple[str, ConversationKey]:
    conv = f"h-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        f"{live.url}{CONV}/{conv}/messages",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers=AUTH,
    )
    assert r.status_code == 201, r.text
    key = ConversationKey("acme", conv)
    for v in range(versions):
        assert live.runtime.state_store.save(
            key, CompressionState(pinned=[f"{v + 1:012d}"]), expected_version=v
        )
    return conv, key


def test_the_journal_is_served_newest_first_and_isolated(live: LiveApi) -> None:
    conv, key = _conversation(live)
    url = f"{live.url}{CONV}/{conv}/journal"
    assert httpx.get(url, headers=AUTH).json() == {"entries": []}
    for n in range(3):
        live.runtime.journal.append(
            key,
            JournalEntry(
                "l0_to_l1", "compressed", datetime.now(UTC), 900, 300, 1, 800, 90, 5.0, version=n + 1
            ),
        )
    body = httpx.get(url, headers=AUTH).json()
    assert [e["version"] for e in body["entries"]] == [3, 2, 1]
    assert body["entries"][0]["model_calls"] == 1 and body["entries"][0]["tokens_after"] == 300
    assert [e["version"] for e in httpx.get(url, params={"limit": 2}, headers=AUTH).json()["entries"]] == [
        3,
        2,
    ]
    assert httpx.get(url, params={"limit": 0}, headers=AUTH).status_code == 422
    # Another tenant, an unknown conversation: 404 with no data.
    other = httpx.get(url, headers={"Authorization": f"Bearer {SLOW_TOKEN}"})
    unknown = httpx.get(f"{live.url}{CONV}/nobody-{uuid.uuid4().hex[:6]}/journal", headers=AUTH)
    assert other.status_code == unknown.status_code == 404 and other.content == unknown.content
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    # Deleted with the conversation.
    assert httpx.delete(f"{live.url}{CONV}/{conv}", headers=AUTH).status_code == 204
    assert httpx.get(url, headers=AUTH).status_code == 404
    assert live.runtime.journal.entries(key) == []


def test_rollback_over_http_restores_a_kept_version_and_journals_it(live: LiveApi) -> None:
    conv, key = _conversation(live, versions=2)
    url = f"{live.url}{CONV}/{conv}/rollback"
    r = httpx.post(url, json={"version": 1}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"restored": 1, "version": 3}
    state = live.runtime.state_store.load(key)
    assert state is not None and state.version == 3 and state.pinned == ["000000000001"]
    newest = live.runtime.journal.entries(key)[0]
    assert (newest.stage, newest.outcome, newest.version) == ("rollback", "rolled_back", 3)
    assert newest.detail == "version 1 restored as version 3"


def test_a_rollback_to_a_version_not_kept_is_a_clear_error_and_changes_nothing(live: LiveApi) -> None:
    conv, key = _conversation(live, versions=2)
    url = f"{live.url}{CONV}/{conv}/rollback"
    r = httpx.post(url, json={"version": 7}, headers=AUTH)
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "version_not_kept" and body["kept"] == [2, 1] and body["version"] == 7
    assert "version 7 is not kept" in body["detail"]
    state = live.runtime.state_store.load(key)
    assert state is not None and state.version == 2 and live.runtime.journal.entries(key) == []
    assert httpx.post(url, json={"version": 0}, headers=AUTH).status_code == 422
    assert httpx.post(url, json={"version": 1, "extra": 1}, headers=AUTH).status_code == 422
    # No saved state yet, an unknown conversation, another tenant's: 404, nothing written.
    fresh, fresh_key = _conversation(live)
    assert (
        httpx.post(f"{live.url}{CONV}/{fresh}/rollback", json={"version": 1}, headers=AUTH).status_code == 404
    )
    assert live.runtime.state_store.load(fresh_key) is None
    other = httpx.post(url, json={"version": 1}, headers={"Authorization": f"Bearer {SLOW_TOKEN}"})
    assert other.status_code == 404
    assert live.runtime.state_store.load(key).version == 2  # type: ignore[union-attr]


def test_the_clients_read_the_journal_and_roll_back(live: LiveApi) -> None:
    conv, _ = _conversation(live, versions=2)
    with CtxcoreClient(live.url, TOKEN) as client:
        done = client.rollback(conv, 1)
        assert (done.restored, done.version) == (1, 3)
        entries = client.journal(conv)
        assert entries[0].outcome == "rolled_back" and entries[0].version == 3
        with pytest.raises(VersionNotKept) as info:
            client.rollback(conv, 42)
        assert info.value.kept == [3, 2, 1] and info.value.version == 42
        with pytest.raises(NotFoundError):
            client.journal(f"nobody-{uuid.uuid4().hex[:6]}")

    async def run() -> tuple[int, int]:
        async with AsyncCtxcoreClient(live.url, TOKEN) as aclient:
            again = await aclient.rollback(conv, 2)
            return again.version, len(await aclient.journal(conv, limit=1))

    assert asyncio.run(run()) == (4, 1)
