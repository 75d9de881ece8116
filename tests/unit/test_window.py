"""Windows: copies, statistics, windowing that keeps anchors, context_max, check_window."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ctxcore import ContextStats, ContextWindow, check_window, from_openai
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import (
    DEFAULT_CONTEXT_MAX_TOKENS,
    apply_window_limits,
    compute_stats,
    drop_leading_tool_messages,
    resolve_context_max,
    resolve_ratio_token_threshold,
)
from tests.datasets import conversations as shared_conversations
from tests.strategies import conversations

U = UserMessage


def A(*ids: str, content: str = "") -> AssistantMessage:
    return AssistantMessage(content=content, tool_calls=[ToolCall(id=i, name="f") for i in ids])


def T(call_id: str) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, content="r")


def test_context_window_copies_defensively() -> None:
    context: list[AnyMessage] = [U(content="a")]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": [1]}}}]
    window = ContextWindow(
        system_messages=[SystemMessage(content="s")], context_messages=context, tools=tools
    )
    context.append(U(content="b"))
    tools[0]["function"]["parameters"]["x"].append(2)  # type: ignore[index]
    assert len(window.context_messages) == 1
    assert window.tools[0]["function"]["parameters"]["x"] == [1]
    got = window.get_messages()
    got.clear()
    assert [m.role for m in window.get_messages()] == ["system", "user"]
    window.get_tools()[0]["function"]["name"] = "g"
    assert window.tools[0]["function"]["name"] == "f"


def test_stats_count_every_role() -> None:
    counter = TiktokenCounter()
    system = [SystemMessage(content="be brief")]
    context: list[AnyMessage] = [U(content="hi"), A("c1"), T("c1"), AssistantMessage(content="done")]
    tools = [{"type": "function", "function": {"name": "f"}}]
    stats = compute_stats(system, context, tools, counter)
    assert isinstance(stats, ContextStats)
    assert (
        stats.total_messages,
        stats.system_messages,
        stats.user_messages,
        stats.assistant_messages,
        stats.tool_messages,
        stats.tools,
        stats.total_dialogues,
    ) == (5, 1, 1, 2, 1, 1, 1)
    assert stats.total_tokens == counter.count_messages([*system, *context]) + counter.count_tools(tools)
    parts = (
        stats.system_message_tokens
        + stats.user_message_tokens
        + stats.assistant_message_tokens
        + stats.tool_message_tokens
    )
    assert parts + 3 + stats.tool_tokens == stats.total_tokens
    assert len(stats.as_dict()) == 13


def test_dialogue_round_window() -> None:
    msgs: list[AnyMessage] = [
        U(content="one"),
        AssistantMessage(content="1"),
        U(content="two"),
        A("c"),
        T("c"),
        AssistantMessage(content="2"),
        U(content="three"),
        AssistantMessage(content="3"),
    ]
    _, ctx = apply_window_limits([], msgs, dialogue_round=1)
    # The task anchor comes back at the head; the last turn follows.
    assert [m.content for m in ctx] == ["one", "three", "3"]
    _, ctx = apply_window_limits([], msgs, dialogue_round=2)
    assert [m.content for m in ctx][:2] == ["one", "two"] and len(ctx) == 7
    _, ctx = apply_window_limits([], msgs, dialogue_round=10)
    assert ctx == msgs


def test_window_size_counts_system_and_keeps_anchors() -> None:
    system = [SystemMessage(content="s1"), SystemMessage(content="s2")]
    msgs: list[AnyMessage] = [
        U(content="task"),
        AssistantMessage(content="a"),
        U(content="intent"),
        A("c1", "c2"),
        T("c1"),
        T("c2"),
        A("c3"),
        T("c3"),
    ]
    sys_out, ctx = apply_window_limits(system, msgs, window_size=3)
    assert [m.content for m in sys_out] == ["s1", "s2"]
    # One context slot: the last tool result alone would be an orphan, so it is dropped,
    # and both anchors are restored.
    assert [m.content for m in ctx] == ["task", "intent"]
    assert check_window([*sys_out, *ctx]) == []
    sys_out, ctx = apply_window_limits(system, msgs, window_size=1)
    assert [m.content for m in sys_out] == ["s2"]


def test_round_applies_before_size() -> None:
    msgs: list[AnyMessage] = [
        U(content="one"),
        AssistantMessage(content="1"),
        U(content="two"),
        AssistantMessage(content="2"),
    ]
    _, ctx = apply_window_limits([], msgs, dialogue_round=2, window_size=1)
    assert [m.content for m in ctx] == ["one", "two", "2"]


def test_orphan_tool_at_head_dropped() -> None:
    msgs: list[AnyMessage] = [T("a"), T("b"), U(content="x")]
    assert drop_leading_tool_messages(msgs) == [msgs[2]]
    assert drop_leading_tool_messages([T("a")]) == []


@given(conversations(), st.integers(1, 8) | st.none(), st.integers(1, 30) | st.none())
def test_windowing_never_violates_or_drops_anchors(
    msgs: list[AnyMessage], rounds: int | None, size: int | None
) -> None:
    system = [m for m in msgs if m.role == "system"]
    context = [m for m in msgs if m.role != "system"]
    sys_out, ctx = apply_window_limits(system, context, dialogue_round=rounds, window_size=size)
    assert check_window([*sys_out, *ctx]) == []
    found = anchors(context)
    for i in found.indices():
        assert any(m is context[i] for m in ctx)


def test_resolve_context_max_precedence() -> None:
    assert resolve_context_max(123, "gpt-4o", {"gpt-4o": 456}) == 123
    assert resolve_context_max(None, "gpt-4o", {"gpt-4o": 456}) == 456
    assert resolve_context_max(None, "GPT-4O", {"gpt-4o": 456}) == 456
    assert resolve_context_max(None, "gpt-4o") == 128_000
    assert resolve_context_max(None, "gpt-5") == 400_000
    assert resolve_context_max(None, "gpt-5.4") == 1_050_000
    assert resolve_context_max(None, "openai/gpt-4o-2024-08-06") == 128_000
    assert resolve_context_max(None, "unknown-model") == DEFAULT_CONTEXT_MAX_TOKENS == 200_000
    assert resolve_context_max(0, None) == 200_000
    assert resolve_ratio_token_threshold(101, 0.1) == 10
    assert resolve_ratio_token_threshold(1, 0.1) == 1


# --- check_window: one failing fixture per rule -----------------------------------------


def rules(msgs: list[AnyMessage]) -> list[tuple[int, str]]:
    return [(v.index, v.rule) for v in check_window(msgs)]


def test_system_after_non_system() -> None:
    assert rules([U(content="x"), SystemMessage(content="s")]) == [(1, "system_after_non_system")]


def test_orphan_tool_result() -> None:
    assert rules([U(content="x"), T("a")]) == [(1, "orphan_tool_result")]
    # A result separated from its call by a user message is an orphan, and the call is missing its result.
    assert rules([A("a"), U(content="x"), T("a")]) == [(0, "missing_tool_result"), (2, "orphan_tool_result")]
    # Ids are matched within the step: an earlier call with the same id does not count.
    assert rules([A("a"), T("a"), AssistantMessage(content="x"), T("a")]) == [(3, "orphan_tool_result")]


def test_duplicate_tool_result() -> None:
    assert rules([A("a"), T("a"), T("a")]) == [(2, "duplicate_tool_result")]


def test_missing_tool_result_unless_in_flight() -> None:
    assert rules([A("a", "b"), T("a"), U(content="x")]) == [(0, "missing_tool_result")]
    assert rules([U(content="x"), A("a", "b"), T("a")]) == []
    assert rules([U(content="x"), A("a")]) == []


def test_every_shared_conversation_is_clean() -> None:
    for conv in shared_conversations():
        assert check_window(from_openai(conv["messages"])) == [], conv["id"]
