"""``POST .../window?preview=true``: the window at any budget, read-only. Any number of
previews records no budget (0 writes) and asks for no compaction (0 jobs queued), on Redis
(over HTTP) and SQL (the service)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from ctxcore.client.calls import calls
from ctxcore.config import Settings, hash_token
from ctxcore.messages import AssistantMessage, UserMessage
from ctxcore.state import ConversationKey, SqlMessageLog, SqlStateStore
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import ContextService, InlineQueue

TOKEN = "secret-token-of-the-preview"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BUDGETS = [300, 500, 800, 1200, 2000, 3000, 5000, 8000, 20_000, 100_000] * 3


def _messages() -> list[dict[str, Any]]:
    out = []
    for i in range(30):
        out.append({"role": "user", "content": f"question {i} " + "words " * 60})
        out.append({"role": "assistant", "content": f"answer {i} " + "more words " * 60})
    return out


class Counting:
    """Counts ``set_budget`` calls on a store (the instance's method, replaced)."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = store.set_budget

        def set_budget(key: ConversationKey, budget_tokens: int) -> None:
            self.calls += 1
            original(key, budget_tokens)

        monkeypatch.setattr(store, "set_budget", set_budget)


@pytest.fixture()
def api(redis_url: str) -> Iterator[tuple[TestClient, Runtime, InlineQueue]]:
    prefix = f"preview{uuid.uuid4().hex[:8]}"
    settings = Settings.load(
        {"redis": {"url": redis_url, "key_prefix": prefix}, "http": {"tokens": {hash_token(TOKEN): "acme"}}}
    )
    runtime, queue = Runtime(settings), InlineQueue()
    client = TestClient(create_app(runtime, queue))
    try:
        yield client, runtime, queue
    finally:
        client.close()
        runtime.redis.close()
        cleaner = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(cleaner, prefix)
        cleaner.close()


@pytest.mark.redis
def test_previews_record_no_budget_and_queue_nothing(
    api: tuple[TestClient, Runtime, InlineQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, runtime, queue = api
    conv = f"p-{uuid.uuid4().hex[:6]}"
    key = ConversationKey("acme", conv)
    assert (
        client.post(
            f"/v1/conversations/{conv}/messages", json={"messages": _messages()}, headers=AUTH
        ).status_code
        == 201
    )
    url = f"/v1/conversations/{conv}/window"
    # Previews before any window: nothing recorded at all.
    writes = Counting(runtime.state_store, monkeypatch)
    totals = {}
    for budget in BUDGETS:
        r = client.post(url, params={"preview": "true"}, json={"budget_tokens": budget}, headers=AUTH)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["stats"]["total_tokens"] <= budget
        totals[budget] = body["stats"]["total_tokens"]
        assert body["compaction"] == "idle"  # over the trigger, yet nothing asked for
    assert totals[300] < totals[2000] < totals[100_000]  # each at its own budget
    assert writes.calls == 0 and runtime.state_store.get_budget(key) is None
    assert queue.requests == []
    # A real window records its budget and asks for a compaction; previews after it change neither.
    assert client.post(url, json={"budget_tokens": 1500}, headers=AUTH).status_code == 200
    assert runtime.state_store.get_budget(key) == 1500 and queue.requests == [key]
    for budget in BUDGETS:
        client.post(url, params={"preview": "true"}, json={"budget_tokens": budget}, headers=AUTH)
    assert runtime.state_store.get_budget(key) == 1500 and queue.requests == [key]
    # An unknown conversation is a 404, and a preview creates nothing.
    unknown = client.post(
        "/v1/conversations/nobody/window",
        params={"preview": "true"},
        json={"budget_tokens": 500},
        headers=AUTH,
    )
    assert unknown.status_code == 404
    assert runtime.state_store.get_budget(ConversationKey("acme", "nobody")) is None


def test_sql_previews_record_no_budget_and_queue_nothing(tmp_path: Path) -> None:
    state = SqlStateStore(f"sqlite:///{tmp_path / 'p.db'}")
    state.setup()
    try:
        log = SqlMessageLog(engine=state.engine)
        key = ConversationKey("acme", "sql-preview")
        log.append(
            key,
            [
                m
                for i in range(30)
                for m in (UserMessage(content=f"q {i} " + "w " * 80), AssistantMessage(content="a " * 80))
            ],
        )
        queue = InlineQueue()
        service = ContextService(Settings.load({}), state, log, None, queue)
        for budget in BUDGETS:
            window = service.get_window(key, budget, preview=True)
            assert window.stats.total_tokens <= budget
        assert state.get_budget(key) is None and queue.requests == []
        service.get_window(key, 1000)  # a real window still records and asks
        assert state.get_budget(key) == 1000 and queue.requests == [key]
    finally:
        state.close()


def test_the_clients_send_preview_as_a_query_flag() -> None:
    call = calls.window("c1", 500, None, None, None, "ctxcore", preview=True)
    assert call.params == {"format": "ctxcore", "preview": "true"}
    assert calls.window("c1", 500, None, None, None, "openai").params == {"format": "openai"}
