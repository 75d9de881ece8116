"""The Redis window read: one script call per window over the conversation's slot."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.errors import NotFoundError
from ctxcore.messages import UserMessage
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state import ConversationKey, RedisMessageLog, RedisOffloadStore, RedisStateStore
from ctxcore.state.models import CompressionState
from tests.unit.test_window_tail import SYSTEM, PlainLog, agent_run
from workers.failures import FailureStore
from workers.service import ContextService, InlineQueue

pytestmark = pytest.mark.redis


class Recording(redis.Redis):
    """A client that counts the commands it sends (a pipeline counts as one)."""

    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)


@pytest.fixture
def client(redis_url: str) -> Any:
    c = Recording.from_url(redis_url)
    c.sent = []
    yield c
    c.close()


def test_a_window_is_one_script_call(client: Recording, redis_prefix: str, conv_key: ConversationKey) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    failures = FailureStore(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue(), failures=failures)
    # The same stores read one call at a time
    plain = ContextService(Settings(), state, log, None, InlineQueue(), failures=failures)
    plain._window_reader = None
    for batch in agent_run(300, user_at=100):
        service.append(conv_key, batch)
    service.get_window(conv_key, 3_000, SYSTEM)  # loads the script (again after a restart)
    service.append(conv_key, agent_run(301)[-1])
    client.sent.clear()
    window = service.get_window(conv_key, 3_000, SYSTEM)
    assert client.sent == ["EVALSHA"]
    assert state.get_budget(conv_key) == 3_000
    other = plain.get_window(conv_key, 3_000, SYSTEM)
    assert window.messages == other.messages and window.raw_tokens == other.raw_tokens
    assert window.compaction == other.compaction == "queued" and window.fallback_applied


def test_the_head_key_and_states_saved_before_it(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    plain = ContextService(Settings(), state, PlainLog(log), None, InlineQueue())  # type: ignore[arg-type]
    for batch in agent_run(20):
        service.append(conv_key, batch)
    # A saved cursor and pinned anchor: the head key says so, and without it the state does
    ids = [m.context_message_id or "" for m in log.read_after(conv_key, None)]
    assert state.save(conv_key, CompressionState(covered_until=ids[6], pinned=[ids[0]]), 0)
    expected = plain.get_window(conv_key, 50_000, SYSTEM)
    assert service.get_window(conv_key, 50_000, SYSTEM).messages == expected.messages
    client.delete(f"{redis_prefix}:{conv_key.hash_tag}:state:head")
    assert service.get_window(conv_key, 50_000, SYSTEM).messages == expected.messages
    assert str(expected.messages[1].content).startswith("Fix the failing build")


def test_the_budget_is_written_only_when_it_changes(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    service.append(conv_key, [UserMessage(content="hello")])
    writes = lambda: int(client.info("commandstats").get("cmdstat_set", {}).get("calls", 0))  # noqa: E731
    for budget in (1000, 1001, 1002):  # a budget that changes on every request
        service.get_window(conv_key, budget, SYSTEM)
        assert state.get_budget(conv_key) == budget
    before = writes()
    service.get_window(conv_key, 1002, SYSTEM)
    assert writes() == before


def test_a_deleted_conversation_is_not_found_and_nothing_is_written(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    service.append(conv_key, [UserMessage(content="hello")])
    assert service.get_window(conv_key, 1000, SYSTEM, require_existing=True).messages[-1].content == "hello"
    log.delete(conv_key)
    state.delete(conv_key)
    with pytest.raises(NotFoundError):
        service.get_window(conv_key, 1000, SYSTEM, require_existing=True)
    assert list(client.scan_iter(match=f"{redis_prefix}:{conv_key.hash_tag}:*")) == []


def test_a_window_offloads_every_cleared_result_in_one_call(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    offloads = RedisOffloadStore(client, redis_prefix)
    service = ContextService(Settings(), state, log, offloads, InlineQueue())
    for batch in agent_run(300, user_at=100):
        service.append(conv_key, batch)
    service.get_window(conv_key, 6_000, SYSTEM)  # loads the scripts
    service.append(conv_key, agent_run(301)[-1])
    client.sent.clear()
    window = service.get_window(conv_key, 6_000, SYSTEM)
    handles = {h[0] for m in window.messages for h in OFFLOAD_MARKER_RE.findall(str(m.content))}
    # The window script, then one script for all of the window's offloads
    assert client.sent == ["EVALSHA", "EVALSHA"] and len(handles) > 10
    for handle in handles:
        assert offloads.get(conv_key, handle) is not None
