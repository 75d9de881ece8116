"""Stored history that no longer decodes is never fatal (ctxcore/state/undecodable.py).

The poisoned entry is what an older version let in: a message whose metadata nests 220
levels, which the stores' JSON writer accepts and their reader refuses. Written straight to
the log (the append checks the contract now), on memory, SQLite and Redis alike: windows
are served without it and without the results answering it, naming it in
``elided_ranges``; appends and the compaction view go on; ``GET .../messages`` lists it as
undecodable with its id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.coordinator import Coordinator
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore, MessageLog, StateStore
from ctxcore.state.redis import RedisMessageLog, RedisStateStore
from ctxcore.state.sql.log import SqlMessageLog
from ctxcore.state.sql.state import SqlStateStore
from ctxcore.state.undecodable import is_undecodable
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import ContextService, InlineQueue

KEY = ConversationKey("acme", "poisoned")
TOKEN = "undecodable-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def poison(depth: int = 220) -> dict[str, Any]:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return {"deep": value}


def history() -> list[AnyMessage]:
    return [
        UserMessage(content="the task: fix the parser"),
        AssistantMessage(content="", tool_calls=[ToolCall(id="c1", name="read")], metadata=poison()),
        ToolMessage(tool_call_id="c1", content="file contents"),
        AssistantMessage(
            content="", tool_calls=[ToolCall(id="c2", name="ls"), ToolCall(id="c3", name="cat")]
        ),
        ToolMessage(tool_call_id="c2", content="a.py b.py", metadata=poison()),
        ToolMessage(tool_call_id="c3", content="print(1)"),
        UserMessage(content="now run the tests"),
    ]


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[StateStore, MessageLog]]:
    if request.param == "memory":
        yield MemoryStateStore(), MemoryMessageLog()
    elif request.param == "sqlite":
        state = SqlStateStore(f"sqlite:///{tmp_path / 'u.db'}")
        state.setup()
        yield state, SqlMessageLog(engine=state.engine, table_prefix=state.table_prefix)
        state.close()
    else:
        url = request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(url)
        prefix = f"undec{uuid.uuid4().hex[:6]}"
        yield RedisStateStore(client, prefix), RedisMessageLog(client, prefix)
        delete_prefixed_keys(client, prefix)
        client.close()


def test_windows_appends_and_compaction_go_on_without_the_entry(
    stores: tuple[StateStore, MessageLog],
) -> None:
    state_store, log = stores
    ids = log.append(KEY, history())
    read = log.read_after(KEY, None)
    assert [is_undecodable(m) for m in read] == [False, True, False, False, True, False, False]
    service = ContextService(Settings(), state_store, log, None, InlineQueue())
    window = service.get_window(KEY, 50_000)
    texts = [m.text for m in window.messages]
    assert texts[0] == "the task: fix the parser" and texts[-1] == "now run the tests"
    assert "file contents" not in texts  # the result answering the lost assistant message
    assert "print(1)" in texts  # a lost result's sibling stays; its own call is closed
    assert check_window(window.messages) == []
    assert (ids[1], ids[2]) in window.elided_ranges and (ids[4], ids[4]) in window.elided_ranges
    # Appends go on, windows grow.
    service.append(KEY, [AssistantMessage(content="running them")])
    assert service.get_window(KEY, 50_000).messages[-1].text == "running them"
    # The compaction view leaves it out too (a stage can fold its range).
    coordinator = Coordinator(state_store, log, TiktokenCounter(), lambda _: ExtractiveModel())
    view = coordinator.view(KEY)
    assert not any(is_undecodable(m) for m in view.tail)
    assert "file contents" not in [m.text for m in view.tail]


@pytest.mark.redis
def test_the_api_lists_it_as_undecodable_and_serves_windows(redis_url: str) -> None:
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": f"undec{uuid.uuid4().hex[:6]}"},
            "http": {"tokens": {hash_token(TOKEN): "acme"}},
        }
    )
    runtime = Runtime(settings)
    try:
        ids = runtime.log.append(KEY, history())
        with TestClient(create_app(runtime, InlineQueue()), raise_server_exceptions=False) as client:
            page = client.get(f"/v1/conversations/{KEY.conversation_id}/messages", headers=AUTH)
            assert page.status_code == 200, page.text
            body = page.json()
            assert [u["id"] for u in body["undecodable"]] == [ids[1], ids[4]]
            assert all(u["detail"] for u in body["undecodable"])
            assert [m["context_message_id"] for m in body["messages"]] == [ids[i] for i in (0, 2, 3, 5, 6)]
            window = client.post(
                f"/v1/conversations/{KEY.conversation_id}/window",
                json={"budget_tokens": 50_000},
                headers=AUTH,
            )
            assert window.status_code == 200, window.text
            assert {"first_id": ids[1], "last_id": ids[2]} in window.json()["elided_ranges"]
            more = client.post(
                f"/v1/conversations/{KEY.conversation_id}/messages",
                json={"messages": [{"role": "assistant", "content": "ok"}]},
                headers=AUTH,
            )
            assert more.status_code == 201, more.text
    finally:
        delete_prefixed_keys(runtime.redis, settings.redis.key_prefix)
        runtime.redis.close()
