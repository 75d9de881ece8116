"""The Redis window read: one round trip per window over the conversation's slot, a script
call or (a short tail after a known cursor) the meta script and the page in one pipeline."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.errors import NotFoundError
from ctxcore.messages import UserMessage
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.recall import ChunkingConfig, archive_messages
from ctxcore.state import ConversationKey, RedisMessageLog, RedisOffloadStore, RedisStateStore
from ctxcore.state.models import CompressionState
from ctxcore.state.redis.window import RedisWindowReader
from ctxcore.state.tail import AppendCounts
from ctxcore.tokens import TiktokenCounter
from tests.unit.test_window_tail import SYSTEM, PlainLog, agent_run, recorded
from workers.failures import FailureStore
from workers.service import ContextService, InlineQueue

pytestmark = pytest.mark.redis


class Recording(redis.Redis):
    """A client that records the commands it sends; a pipeline is one entry naming its
    commands joined by ``+`` (one round trip)."""

    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        run = pipe.execute

        def execute(raise_on_error: bool = True) -> Any:
            self.sent.append("+".join(str(args[0]) for args, _ in pipe.command_stack))
            return run(raise_on_error)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


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
    assert state.get_budget(conv_key) == recorded(3_000)
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
    assert state.cursor(conv_key) == ids[6]
    client.delete(f"{redis_prefix}:{conv_key.hash_tag}:state:head")
    assert service.get_window(conv_key, 50_000, SYSTEM).messages == expected.messages
    assert state.cursor(conv_key) == ids[6]  # from the state, as the window reads it
    assert str(expected.messages[1].content).startswith("Fix the failing build")


def test_an_append_is_three_round_trips(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    batches = agent_run(20)
    for batch in batches[:-1]:
        service.append(conv_key, batch)
    client.sent = []
    service.append(conv_key, batches[-1])
    # The cursor (head key, and whether a state exists), the validation tail, the append.
    assert client.sent == ["GET+EXISTS", "XREVRANGE", "ZADD+EVALSHA"]


def test_the_budget_is_written_only_when_it_changes(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = RedisStateStore(client, redis_prefix), RedisMessageLog(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    service.append(conv_key, [UserMessage(content="hello")])
    writes = lambda: int(client.info("commandstats").get("cmdstat_set", {}).get("calls", 0))  # noqa: E731
    for budget in (1000, 1001, 1002):  # a budget that changes on every request
        service.get_window(conv_key, budget, SYSTEM)
        assert state.get_budget(conv_key) == recorded(budget)
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


def stores(client: Recording, prefix: str) -> tuple[RedisStateStore, RedisMessageLog]:
    return RedisStateStore(client, prefix), RedisMessageLog(client, prefix)


def services(
    client: Recording, prefix: str
) -> tuple[RedisStateStore, RedisMessageLog, ContextService, ContextService]:
    """The stores, a service reading windows through them and one reading the whole tail."""
    state, log = stores(client, prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    plain = ContextService(Settings(), state, PlainLog(log), None, InlineQueue())  # type: ignore[arg-type]
    return state, log, service, plain


def test_every_window_is_the_one_script_call_whatever_the_cursor_did(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log, service, plain = services(client, redis_prefix)
    for batch in agent_run(20, user_at=5):
        service.append(conv_key, batch)
    ids = [m.context_message_id or "" for m in log.read_after(conv_key, None)]
    assert state.save(conv_key, CompressionState(covered_until=ids[10], pinned=[ids[0]]), 0)
    client.sent.clear()
    service.get_window(conv_key, 50_000, SYSTEM)
    assert client.sent == ["EVALSHA"]
    for step in agent_run(23)[21:]:
        service.append(conv_key, step)
        client.sent.clear()
        window = service.get_window(conv_key, 50_000, SYSTEM)
        assert client.sent == ["EVALSHA"]
        expected = plain.get_window(conv_key, 50_000, SYSTEM)
        assert window.messages == expected.messages and window.stats == expected.stats
        assert window.raw_tokens == expected.raw_tokens
    # A compaction moves the cursor forward
    assert state.save(conv_key, CompressionState(covered_until=ids[25], pinned=[ids[0]]), 1)
    client.sent.clear()
    window = service.get_window(conv_key, 50_000, SYSTEM)
    assert client.sent == ["EVALSHA"]
    assert window.messages == plain.get_window(conv_key, 50_000, SYSTEM).messages
    # A rollback moves it back
    assert state.rollback(conv_key, 1, 2)
    client.sent.clear()
    window = service.get_window(conv_key, 50_000, SYSTEM)
    assert client.sent == ["EVALSHA"]
    assert window.messages == plain.get_window(conv_key, 50_000, SYSTEM).messages


def test_a_tail_outgrowing_the_page_is_read_by_the_script(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    _state, _log, service, plain = services(client, redis_prefix)
    for batch in agent_run(10):
        service.append(conv_key, batch)
    service.get_window(conv_key, 4_000, SYSTEM)
    for batch in agent_run(90)[11:]:  # 158 more entries, no window between (workers down)
        service.append(conv_key, batch)
    client.sent.clear()
    window = service.get_window(conv_key, 4_000, SYSTEM)
    assert client.sent == ["EVALSHA"] and window.fallback_applied
    expected = plain.get_window(conv_key, 4_000, SYSTEM)
    assert window.messages[-1] == expected.messages[-1] and window.stats.total_tokens <= 4_000
    client.sent.clear()
    service.get_window(conv_key, 4_000, SYSTEM)
    assert client.sent == ["EVALSHA"]


def test_counts_stored_under_an_earlier_run_are_not_taken_for_the_current_one(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    _state, log, service, plain = services(client, redis_prefix)
    batches = agent_run(6)
    # The first entries were counted under another encoding (another deployment's default)
    first = [m for batch in batches[:4] for m in batch]
    log.counted().append_counted(
        conv_key, first, AppendCounts("o200k_base", [5_000] * len(first), [False] * len(first))
    )
    for batch in batches[4:]:
        service.append(conv_key, batch)  # cl100k_base: a new run starts here
    expected = plain.get_window(conv_key, 20_000, SYSTEM)
    for _ in range(2):
        window = service.get_window(conv_key, 20_000, SYSTEM)
        assert window.messages == expected.messages and window.stats == expected.stats
        assert window.raw_tokens == expected.raw_tokens < 5_000


def test_the_recall_index_comes_with_the_read_only_when_newer(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = stores(client, redis_prefix)
    settings = Settings.load({"recall": {"enabled": True, "auto": True}})
    service = ContextService(settings, state, log, None, InlineQueue())
    for batch in agent_run(30, user_at=3):
        service.append(conv_key, batch)
    logged = log.read_after(conv_key, None)
    index, write = archive_messages(None, logged[:40], TiktokenCounter(), ChunkingConfig())
    assert write is not None
    saved = CompressionState(covered_until=logged[39].context_message_id, archive_version=write.version)
    assert state.save(conv_key, saved, 0, archive=write)
    for _ in range(3):
        client.sent.clear()
        service.get_window(conv_key, 50_000, SYSTEM)
        assert "GET" not in client.sent and len(client.sent) == 1  # the index came with the read
    assert service._indexes.version(conv_key) == index.version


def test_a_50000_entry_tail_after_a_worker_outage_reads_only_its_newest_pages(
    client: Recording, redis_prefix: str, conv_key: ConversationKey
) -> None:
    state, log = stores(client, redis_prefix)
    service = ContextService(Settings(), state, log, None, InlineQueue())
    batches = agent_run(25_000, user_at=20_000)
    counter = TiktokenCounter()
    flat = [m for batch in batches for m in batch]
    real = [i == 0 or str(m.content).startswith("now also") for i, m in enumerate(flat)]
    for i in range(0, len(flat), 2_000):  # appended while no worker compacted anything
        chunk = flat[i : i + 2_000]
        counts = AppendCounts(
            counter.encoding_name, [counter.count_message(m) for m in chunk], real[i : i + 2_000]
        )
        log.counted().append_counted(conv_key, chunk, counts)
    assert len(flat) > 50_000
    last = log.last_id(conv_key)
    client.sent.clear()
    window = service.get_window(conv_key, 8_000, SYSTEM)
    texts = [str(m.content) for m in window.messages]
    assert window.stats.total_tokens <= 8_000 and window.fallback_applied
    assert texts[1] == "Fix the failing build in repo x, please." and "now also check module 20000" in texts
    assert client.sent == ["EVALSHA"]
    assert window.messages[-1].context_message_id == last
    # Newest first, until the stored counts fill the budget: a few pages, not the 50,000
    reader = service._window_reader
    assert isinstance(reader, RedisWindowReader) and len(reader.decoded) < 1_000
    assert window.raw_tokens > 50 * 8_000  # the trigger still sees the whole tail
