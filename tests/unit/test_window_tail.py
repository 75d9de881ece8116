"""Windows over stored counts and newest-first tails (``workers.service.tail``)."""

from __future__ import annotations

import pytest

from ctxcore.config import Settings
from ctxcore.errors import BudgetExceeded, InvalidMessageError
from ctxcore.markers import ELIDED_STEPS
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.tokens import EstimateCounter, TiktokenCounter
from workers.service import ContextService, InlineQueue

KEY = ConversationKey("t", "c")
SYSTEM = [SystemMessage(content="You are terse.")]


def recorded(budget_tokens: int) -> int:
    """The budget a window of ``budget_tokens`` with ``SYSTEM`` records for the workers: the
    room its messages have (``conversation_budget``)."""
    return budget_tokens - TiktokenCounter().count_messages(SYSTEM)


class PlainLog:
    """A memory log without the CountedLog capability (the whole tail, counted on read)."""

    def __init__(self, inner: MemoryMessageLog) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        if name in ("append_counted", "read_tail", "store_counts"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def counted(self) -> None:
        return None


def service(log: object, counter: EstimateCounter | None = None) -> ContextService:
    return ContextService(Settings(), MemoryStateStore(), log, None, InlineQueue(), counter=counter)  # type: ignore[arg-type]


def agent_run(steps: int, *, user_at: int | None = None) -> list[list[AnyMessage]]:
    """Batches as an agent appends them: a task, then tool steps (a user message now and then)."""
    out: list[list[AnyMessage]] = [[UserMessage(content="Fix the failing build in repo x, please.")]]
    for i in range(steps):
        batch: list[AnyMessage] = [
            AssistantMessage(
                content="", tool_calls=[ToolCall(id=f"c{i}", name="bash", arguments='{"c": "ls"}')]
            ),
            ToolMessage(content=f"output {i} " + "word " * 40, tool_call_id=f"c{i}"),
        ]
        if i == user_at:
            batch.append(UserMessage(content=f"now also check module {i}"))
        out.append(batch)
    return out


def fill(*services: ContextService, steps: int, user_at: int | None = None) -> None:
    for batch in agent_run(steps, user_at=user_at):
        for s in services:
            s.append(KEY, batch)


def test_a_tail_that_fits_gives_the_window_of_the_whole_tail() -> None:
    shared = MemoryMessageLog()
    counted, plain = service(shared), service(PlainLog(shared))
    fill(counted, steps=40)
    assert shared.counted() is not None and plain.log.counted() is None
    for budget in (100_000, 3_000, 1_500):
        a = counted.get_window(KEY, budget, SYSTEM)
        b = plain.get_window(KEY, budget, SYSTEM)
        assert a.messages == b.messages and a.stats == b.stats and a.raw_tokens == b.raw_tokens


def test_a_long_tail_is_read_newest_first_behind_a_marker_keeping_both_anchors() -> None:
    shared = MemoryMessageLog()
    counted, plain = service(shared), service(PlainLog(shared))
    fill(counted, steps=400, user_at=150)
    a = counted.get_window(KEY, 4_000, SYSTEM)
    b = plain.get_window(KEY, 4_000, SYSTEM)
    assert a.stats.total_tokens <= 4_000 and a.fallback_applied
    texts = [str(m.content) for m in a.messages]
    # The task, the latest real user message and the newest step are all served
    assert "Fix the failing build in repo x, please." in texts
    assert "now also check module 150" in texts
    assert a.messages[-1].context_message_id == b.messages[-1].context_message_id
    markers = [m for m in a.messages if str(m.content).startswith(ELIDED_STEPS)]
    assert markers and a.elided_ranges[: len(markers)] == [
        (m.metadata["elided"]["first_id"], m.metadata["elided"]["last_id"]) for m in markers
    ]
    # The trigger sees the whole tail from the stored totals, as if it had been read
    assert a.raw_tokens == b.raw_tokens


def test_an_anchor_only_in_the_unread_part_is_fetched() -> None:
    log = MemoryMessageLog()
    s = service(log)
    fill(s, steps=300)
    window = s.get_window(KEY, 3_000, SYSTEM)
    assert str(window.messages[1].content) == "Fix the failing build in repo x, please."
    assert str(window.messages[2].content).startswith(ELIDED_STEPS)
    assert window.elided_ranges[0][0] == "000000000002"


def test_custom_counters_bypass_stored_counts() -> None:
    log = MemoryMessageLog()
    s = service(log, counter=EstimateCounter())
    fill(s, steps=200)
    read = log.read_tail(KEY, None, budget_tokens=10, encoding="o200k_base")
    assert read.omitted is None and set(read.counts) == {None}
    window = s.get_window(KEY, 3_000, SYSTEM)
    assert window.stats.total_tokens <= 3_000


def test_a_client_switching_encodings_gets_counts_stored_for_each() -> None:
    log = MemoryMessageLog()
    s = service(log)
    fill(s, steps=50)
    first = s.get_window(KEY, 50_000, SYSTEM, model="gpt-4")  # cl100k_base
    read = log.read_tail(KEY, None, budget_tokens=50_000, encoding="cl100k_base")
    assert None not in read.counts
    again = s.get_window(KEY, 50_000, SYSTEM, model="gpt-4")
    other = s.get_window(KEY, 50_000, SYSTEM, model="gpt-4o")
    assert first.messages == again.messages == other.messages
    assert first.stats.total_tokens == again.stats.total_tokens != other.stats.total_tokens


def test_a_budget_of_one_token_is_budget_exceeded_on_a_paged_tail() -> None:
    s = service(MemoryMessageLog())
    fill(s, steps=300)
    with pytest.raises(BudgetExceeded):
        s.get_window(KEY, 1, SYSTEM)


def test_a_budget_that_changes_on_every_request_stays_within_it() -> None:
    s = service(MemoryMessageLog())
    fill(s, steps=300, user_at=120)
    for budget in range(2_000, 9_000, 700):
        window = s.get_window(KEY, budget, SYSTEM)
        assert window.stats.total_tokens <= budget
        assert "now also check module 120" in [str(m.content) for m in window.messages]


def test_an_append_after_a_long_tail_reads_only_its_end() -> None:
    log = MemoryMessageLog()
    s = service(log)
    fill(s, steps=600)  # 1,201 entries, nothing compacted (workers down)
    reads: list[int] = []
    original = log.read_newest

    def spied(key: ConversationKey, cursor: str | None, limit: int) -> list[AnyMessage]:
        found = original(key, cursor, limit)
        reads.append(len(found))
        return found

    log.read_newest = spied  # type: ignore[method-assign]
    s.append(KEY, [AssistantMessage(content="", tool_calls=[ToolCall(id="z", name="bash")])])
    s.append(KEY, [ToolMessage(content="done", tool_call_id="z")])
    with pytest.raises(InvalidMessageError):
        s.append(KEY, [ToolMessage(content="orphan", tool_call_id="nope")])
    assert reads and max(reads) <= 513  # VALIDATION_SPAN, and one more: the tail is longer
