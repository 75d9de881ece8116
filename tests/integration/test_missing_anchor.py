"""A pinned anchor missing from the log is the same error on every read path.

The Coordinator raises ``CursorNotFoundError`` when a state pins a log id the log lacks;
so does every window read (the memory stores one by one, the Redis script and its paged
shape, the SQL statement, and the one-by-one reads of a preview), never a window served
without the anchor. Over HTTP it is a 409 ``invalid_state`` whose detail says to roll back.
An entry that is in the log but no longer decodes is not missing: the undecodable rule
leaves it out of the window (``ctxcore.state.undecodable``).
"""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.coordinator import Coordinator
from ctxcore.errors import CursorNotFoundError
from ctxcore.messages import AssistantMessage, UserMessage
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.state.base import format_log_id
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import EstimateCounter, TiktokenCounter
from tests.conftest import Backend
from tests.integration.test_undecodable import history
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import ContextService, InlineQueue

LOST = format_log_id(999)
HINT = "inspect the state history and roll back, or delete the conversation"


def conversation(backend: Backend, key: ConversationKey) -> list[str]:
    """A conversation whose state pins its task and a log id the log does not hold."""
    ids = backend.log.append(
        key,
        [
            UserMessage(content="the task: fix the parser"),
            AssistantMessage(content="looking"),
            UserMessage(content="and the tests"),
            AssistantMessage(content="on it"),
        ],
    )
    assert backend.state.save(key, CompressionState(covered_until=ids[1], pinned=[ids[0], LOST]), 0)
    return ids


def test_every_read_path_raises_the_coordinators_error(backend: Backend, conv_key: ConversationKey) -> None:
    # Given a state pinning a log id the log lacks
    conversation(backend, conv_key)
    coordinator = Coordinator(backend.state, backend.log, TiktokenCounter(), lambda _: ExtractiveModel())
    with pytest.raises(CursorNotFoundError) as raised:
        coordinator.view(conv_key)
    expected = f"{conv_key}: pinned message {LOST!r} is missing from the log"
    assert str(raised.value).startswith(expected)
    service = ContextService(Settings(), backend.state, backend.log, None, InlineQueue())
    estimated = ContextService(
        Settings(), backend.state, backend.log, None, InlineQueue(), counter=EstimateCounter()
    )
    # When windows are read: twice (Redis pages the second), as a preview (the stores one by
    # one) and with a counter whose counts the log does not store
    reads = [
        lambda: service.get_window(conv_key, 10_000),
        lambda: service.get_window(conv_key, 10_000),
        lambda: service.get_window(conv_key, 10_000, preview=True),
        lambda: estimated.get_window(conv_key, 10_000),
    ]
    # Then each raises the same error, with the way out
    for read in reads:
        with pytest.raises(CursorNotFoundError) as window_raised:
            read()
        assert str(window_raised.value) == f"{expected}; {HINT}"


def test_an_undecodable_pinned_entry_is_left_out_not_missing(
    backend: Backend, conv_key: ConversationKey
) -> None:
    # Given a state pinning an entry that is in the log but no longer decodes
    ids = backend.log.append(conv_key, history())
    assert backend.state.save(conv_key, CompressionState(covered_until=ids[2], pinned=[ids[0], ids[1]]), 0)
    service = ContextService(Settings(), backend.state, backend.log, None, InlineQueue())
    # When a window is read, Then it is served without the entry (the undecodable rule wins)
    for preview in (False, False, True):
        window = service.get_window(conv_key, 50_000, preview=preview)
        served = [m.context_message_id for m in window.messages]
        assert ids[0] in served and ids[1] not in served


@pytest.mark.redis
def test_the_api_answers_409_with_the_rollback_hint(redis_url: str) -> None:
    token = "anchor-token"
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": f"anchor{uuid.uuid4().hex[:6]}"},
            "http": {"tokens": {hash_token(token): "acme"}},
        }
    )
    runtime = Runtime(settings)
    key = ConversationKey("acme", "lost-anchor")
    try:
        ids = runtime.log.append(key, [UserMessage(content="task"), AssistantMessage(content="ok")])
        assert runtime.state_store.save(key, CompressionState(covered_until=ids[1], pinned=[LOST]), 0)
        with TestClient(create_app(runtime, InlineQueue()), raise_server_exceptions=False) as client:
            answer = client.post(
                f"/v1/conversations/{key.conversation_id}/window",
                json={"budget_tokens": 10_000},
                headers={"Authorization": f"Bearer {token}"},
            )
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "invalid_state"
        assert LOST in answer.json()["detail"] and HINT in answer.json()["detail"]
    finally:
        delete_prefixed_keys(runtime.redis, settings.redis.key_prefix)
        runtime.redis.close()
