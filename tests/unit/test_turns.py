"""Turns, steps, anchors and the tool-boundary rules, including id reuse across steps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ctxcore.markers import MEMORY_BLOCK_DIALOGUE, ROUND_LEVEL_MEMORY_BLOCK, STATE_REINJECTION
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.turns import (
    UserDetector,
    adjust_keep_recent_for_tool_boundaries,
    anchors,
    count_turns,
    is_real_user,
    steps,
    turns,
)
from ctxcore.window import check_window
from tests.strategies import conversations

U = UserMessage


def A(*ids: str, content: str = "") -> AssistantMessage:
    return AssistantMessage(content=content, tool_calls=[ToolCall(id=i, name="f") for i in ids])


def T(call_id: str, content: str = "r", **meta: object) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, content=content, metadata=dict(meta))


def test_internal_prefixes_are_not_real_users() -> None:
    for marker in (
        "<memory_block_round>",
        "<recovered_context>",
        "<system-reminder>",
        ROUND_LEVEL_MEMORY_BLOCK,
        MEMORY_BLOCK_DIALOGUE,
        STATE_REINJECTION,
        "[CURRENT_ROUND_MEMORY_BLOCK]",
    ):
        assert not is_real_user(U(content=f"  {marker} body"))
    assert is_real_user(U(content='你收到一条消息： {"type": "user input"}'))
    assert not is_real_user(AssistantMessage(content="hi"))


def test_configurable_prefixes_and_patterns() -> None:
    det = UserDetector(extra_prefixes=("[HARNESS]",), patterns=(r"#\d+ auto",))
    assert not det.is_real(U(content="[HARNESS] ping"))
    assert not det.is_real(U(content="#12 auto-continue"))
    assert det.is_real(U(content="real question"))


def test_anchors() -> None:
    msgs: list[AnyMessage] = [
        U(content=f"{ROUND_LEVEL_MEMORY_BLOCK} x"),
        U(content="task"),
        A(content="ok"),
        U(content="next"),
        A("c1"),
        T("c1"),
        U(content="<system-reminder> r"),
    ]
    assert anchors(msgs).indices() == (1, 3)
    assert anchors([A(content="x")]).indices() == ()


def test_steps_partition_and_close_on_all_results() -> None:
    msgs: list[AnyMessage] = [
        U(content="q"),
        A("c1", "c2"),
        T("c2"),
        T("c1"),
        A(content="done"),
        U(content="more"),
        A("c1"),
        T("c1"),
        A("c9"),
    ]
    got = steps(msgs)
    assert [(s.start, s.end, s.complete) for s in got] == [
        (0, 4, True),
        (4, 5, True),
        (5, 8, True),
        (8, 9, False),
    ]


def test_turn_flags() -> None:
    msgs: list[AnyMessage] = [
        U(content="one"),
        A("c1"),
        T("c1", is_error=True),
        A(content="failed"),
        U(content="two"),
        A("c1"),
        T("c1", cancelled=True),
        A(content="stopped"),
        U(content="three"),
        A("c1"),
        T("c1"),
        A(content="fine"),
        U(content="four"),
        A("c1"),
    ]
    got = turns(msgs)
    assert [(t.start, t.end) for t in got] == [(0, 4), (4, 8), (8, 12), (12, 14)]
    assert [t.failed for t in got] == [True, False, False, False]
    assert [t.cancelled for t in got] == [False, True, False, False]
    assert [t.complete for t in got] == [True, True, True, False]
    assert got[2].final == 11


def test_internal_user_messages_do_not_start_turns() -> None:
    msgs: list[AnyMessage] = [
        U(content="a"),
        A(content="x"),
        U(content="<memory_block_round> s"),
        A(content="y"),
    ]
    assert len(turns(msgs)) == 1


def test_keep_recent_widens_to_calling_assistant() -> None:
    msgs: list[AnyMessage] = [U(content="q"), A("c1", "c2"), T("c1"), T("c2"), A(content="done")]
    assert adjust_keep_recent_for_tool_boundaries(msgs, 2) == 4
    assert adjust_keep_recent_for_tool_boundaries(msgs, 1) == 1
    assert adjust_keep_recent_for_tool_boundaries(msgs, 0) == 0
    assert adjust_keep_recent_for_tool_boundaries(msgs, -3) == 0
    assert adjust_keep_recent_for_tool_boundaries([], 3) == 3


def test_keep_recent_matches_ids_within_step_only() -> None:
    # The same id "c1" in two steps: the tail's result belongs to the later call only.
    msgs: list[AnyMessage] = [U(content="q"), A("c1"), T("c1"), A("c1"), T("c1"), A(content="done")]
    assert adjust_keep_recent_for_tool_boundaries(msgs, 2) == 3


@given(conversations(), st.integers(min_value=0, max_value=40))
def test_keep_recent_tail_never_violates(messages: list[AnyMessage], keep: int) -> None:
    messages = [m for m in messages if m.role != "system"]
    k = adjust_keep_recent_for_tool_boundaries(messages, keep)
    if messages:
        assert min(keep, len(messages)) <= k <= len(messages)
    tail = messages[len(messages) - k :] if k else []
    assert check_window(tail) == []


@given(conversations())
def test_count_turns_is_the_number_of_turns(messages: list[AnyMessage]) -> None:
    harness = UserDetector(harness_structure=True)
    for detector in (None, harness):
        assert count_turns(messages, detector) == len(turns(messages, detector))
