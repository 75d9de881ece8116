"""Auto-recall: leftover room spent on archived passages near the intent, served only."""

from __future__ import annotations

import pytest

from ctxcore.assemble import assemble_window
from ctxcore.config import Settings
from ctxcore.errors import InvalidMessageError
from ctxcore.markers import RECALLED_CONTEXT
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_text,
)
from ctxcore.pipeline import block_message
from ctxcore.recall import ChunkingConfig, RecallIndex, archive_messages
from ctxcore.recall.auto import AutoRecall, recall_position, recall_query
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.state.memory import MemoryMessageLog, MemoryStateStore
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR
from ctxcore.window import check_window
from workers.service import ContextService, InlineQueue

COUNTER = TiktokenCounter()
SYSTEM = [SystemMessage(content="You are a helpful assistant.")]


def history() -> list[AnyMessage]:
    out: list[AnyMessage] = [UserMessage(content="Help me plan the trip. I am Ana.")]
    for i in range(30):
        out.append(
            AssistantMessage(
                content=f"Noted item {i}: the ferry to island{i} leaves at {6 + i % 12}:15 from pier {i}."
            )
        )
        out.append(UserMessage(content=f"ok, and what about island{i}?"))
    out.append(AssistantMessage(content="Anything else?"))
    out.append(UserMessage(content="When does the ferry to island7 leave, and from which pier?"))
    return [m.model_copy(update={"context_message_id": f"{n:012d}"}) for n, m in enumerate(out, 1)]


def state_and_index(
    messages: list[AnyMessage], covered: int
) -> tuple[CompressionState, RecallIndex, list[AnyMessage]]:
    folded = messages[1:covered]
    index, _ = archive_messages(None, folded, COUNTER, ChunkingConfig(300, 30, 64))
    block = SummaryBlock(
        block_id=f"L1-{folded[0].context_message_id}-{folded[-1].context_message_id}",
        messages=[
            block_message(
                "- the user planned ferries to many islands",
                block_id="b",
                first_id=str(folded[0].context_message_id),
                last_id=str(folded[-1].context_message_id),
                level=1,
                scope="completed_react",
            )
        ],
        first_id=str(folded[0].context_message_id),
        last_id=str(folded[-1].context_message_id),
    )
    state = CompressionState(
        version=1,
        blocks=[block],
        covered_until=folded[-1].context_message_id,
        pinned=[str(messages[0].context_message_id)],
        archive_version=1,
    )
    return state, index, messages[covered:]


def test_the_room_left_holds_passages_near_the_intent_at_the_end_of_the_window() -> None:
    messages = history()
    state, index, tail = state_and_index(messages, 50)
    plain = assemble_window(state, tail, 4000, SYSTEM, [], None, COUNTER, pinned=[messages[0]])
    result = assemble_window(
        state,
        tail,
        4000,
        SYSTEM,
        [],
        None,
        COUNTER,
        pinned=[messages[0]],
        auto_recall=AutoRecall(index, 0.25),
    )
    assert result.recall is not None and result.recall.passages >= 1 and result.recall.tokens > 0
    recalled = [m for m in result.messages if message_text(m).startswith(RECALLED_CONTEXT)]
    assert len(recalled) == 1 and "island7" in message_text(recalled[0])
    at = result.messages.index(recalled[0])
    # Last (the passages change with each window: anywhere else they would rewrite what
    # follows them for a provider's prompt cache); everything else as without recall.
    assert at == len(result.messages) - 1
    assert [m for m in result.messages if m is not recalled[0]] == plain.messages
    tokens = COUNTER.count_messages(result.messages)
    assert tokens <= 4000 and result.recall.tokens <= 1000 and check_window(result.messages) == []
    assert not DEFAULT_DETECTOR.is_real(recalled[0])  # never an anchor


def test_the_next_window_shares_everything_before_the_passages() -> None:
    messages = history()
    state, index, tail = state_and_index(messages, 50)
    auto = AutoRecall(index, 0.25)
    first = assemble_window(
        state, tail[:-2], 4000, SYSTEM, [], None, COUNTER, pinned=[messages[0]], auto_recall=auto
    )
    second = assemble_window(
        state, tail, 4000, SYSTEM, [], None, COUNTER, pinned=[messages[0]], auto_recall=auto
    )
    assert first.recall is not None and first.recall.passages >= 1
    assert second.messages[: len(first.messages) - 1] == first.messages[:-1]


def test_a_step_in_flight_stays_last_after_the_passages() -> None:
    call = ToolCall(id="c-open", name="lookup", arguments='{"q": "ferry island7"}')
    step = AssistantMessage(content="", tool_calls=[call], context_message_id="000000000900")
    answered = ToolMessage(content="pier 4", tool_call_id="c-open", context_message_id="000000000901")
    assert recall_position([messages_one := UserMessage(content="go"), step]) == 1
    assert recall_position([messages_one, step, answered]) == 3
    assert recall_position([messages_one]) == 1 and recall_position([]) == 0
    messages = history()
    state, index, tail = state_and_index(messages, 50)
    result = assemble_window(
        state,
        [*tail, step],
        4000,
        SYSTEM,
        [],
        None,
        COUNTER,
        pinned=[messages[0]],
        auto_recall=AutoRecall(index),
    )
    assert result.recall is not None and result.recall.passages >= 1
    assert result.messages[-1] == step and message_text(result.messages[-2]).startswith(RECALLED_CONTEXT)
    assert check_window(result.messages) == []


def test_no_recall_when_the_fallback_applied_or_nothing_matches() -> None:
    messages = history()
    state, index, tail = state_and_index(messages, 50)
    tight = COUNTER.count_messages([*SYSTEM, messages[0], *tail]) + 40
    squeezed = assemble_window(
        state, tail, tight, SYSTEM, [], None, COUNTER, pinned=[messages[0]], auto_recall=AutoRecall(index)
    )
    assert squeezed.fallback_applied and squeezed.recall is None
    assert not any(message_text(m).startswith(RECALLED_CONTEXT) for m in squeezed.messages)
    empty, _ = archive_messages(
        None, [UserMessage(content="zzz", context_message_id="000000000002")], COUNTER, ChunkingConfig()
    )
    other = assemble_window(
        state, tail, 4000, SYSTEM, [], None, COUNTER, pinned=[messages[0]], auto_recall=AutoRecall(empty)
    )
    assert other.recall is not None and other.recall.passages == 0


def test_the_query_is_deterministic_and_bounded() -> None:
    messages = history()
    long_intent = UserMessage(content="word " * 5000)
    query = recall_query(long_intent, messages[-5:], COUNTER)
    assert query == recall_query(long_intent, messages[-5:], COUNTER)
    assert COUNTER.count_text(query) <= 512 + 4


def test_the_recalled_message_is_never_logged() -> None:
    service = ContextService(Settings(), MemoryStateStore(), MemoryMessageLog(), None, InlineQueue())
    with pytest.raises(InvalidMessageError, match="ctxcore's own"):
        service.append(ConversationKey("t", "c"), [UserMessage(content=f"{RECALLED_CONTEXT} passages")])
