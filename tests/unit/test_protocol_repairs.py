"""Served windows keep the chat protocol: interrupted calls answered, leading orphans dropped,
the raw log and view untouched; distributed appends accept exactly the interrupted shape."""

from __future__ import annotations

import pytest

from ctxcore.config import Settings
from ctxcore.engine import ContextEngine
from ctxcore.errors import ConflictError, InvalidMessageError, InvalidWindowError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.pipeline import View
from ctxcore.pipeline.targets import eligible_raw
from ctxcore.protocol import (
    INTERRUPTED_TOOL_RESULT,
    check_window,
    close_interrupted_tool_calls,
    drop_leading_orphans,
    interrupted_by_user,
)
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.turns import steps, turns
from workers.service import ContextService, InlineQueue

U = UserMessage
KEY = ConversationKey("acme", "c")


def A(*ids: str, content: str = "") -> AssistantMessage:
    return AssistantMessage(content=content, tool_calls=[ToolCall(id=i, name="f") for i in ids])


def T(call_id: str, content: str = "r") -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, content=content)


def interrupted() -> list[AnyMessage]:
    return [U(content="run it"), A("cancel-1"), U(content="never mind"), A(content="ok")]


def test_close_interrupted_tool_calls_answers_right_after_the_step() -> None:
    raw = interrupted()
    assert [v.rule for v in check_window(raw)] == ["missing_tool_result"]
    closed = close_interrupted_tool_calls(raw)
    assert check_window(closed) == []
    assert [m.role for m in closed] == ["user", "assistant", "tool", "user", "assistant"]
    added = closed[2]
    assert isinstance(added, ToolMessage) and added.tool_call_id == "cancel-1"
    assert added.content == INTERRUPTED_TOOL_RESULT and added.metadata["cancelled"] is True
    assert added.context_message_id is None  # not a log message
    assert raw == interrupted()  # the input is not changed


def test_partial_results_and_assistant_interruptions_are_closed_in_flight_is_not() -> None:
    partial = [U(content="go"), A("c1", "c2"), T("c1"), U(content="stop")]
    closed = close_interrupted_tool_calls(partial)
    assert [getattr(m, "tool_call_id", None) for m in closed] == [None, None, "c1", "c2", None]
    assert check_window(closed) == []
    by_assistant = [U(content="go"), A("c1"), A(content="moving on")]
    assert check_window(close_interrupted_tool_calls(by_assistant)) == []
    in_flight = [U(content="go"), A("c1", "c2"), T("c1")]
    assert close_interrupted_tool_calls(in_flight) == in_flight
    assert interrupted_by_user(partial, 1) and not interrupted_by_user(by_assistant, 1)


def test_leading_orphans_are_dropped_a_valid_head_stays() -> None:
    orphan_head: list[AnyMessage] = [A(content="hi"), T("orphan-call"), U(content="q"), A(content="a")]
    assert drop_leading_orphans(orphan_head) == orphan_head[2:]
    tool_head: list[AnyMessage] = [T("x"), A(content="stray"), U(content="q")]
    assert drop_leading_orphans(tool_head) == tool_head[2:]
    # A dialogue opened by the other speaker keeps its first message
    greeting: list[AnyMessage] = [A(content="Hey Jon!"), U(content="Hi Gina"), A(content="...")]
    assert drop_leading_orphans(greeting) == greeting
    # No user message: only leading tool results go (spec 2.4 step 5)
    assert drop_leading_orphans([T("x"), A(content="a")]) == [A(content="a")]


def test_an_interrupted_step_is_complete_and_cancelled_so_the_cursor_can_pass_it() -> None:
    found = steps(interrupted())
    assert found[0].complete and found[0].interrupted and (found[0].start, found[0].end) == (0, 2)
    assert all(s.complete for s in found)
    assert turns(interrupted())[0].cancelled
    messages = [
        m.model_copy(update={"context_message_id": f"{i + 1:012d}"}) for i, m in enumerate(interrupted())
    ]
    # Every step is eligible for a summary, the interrupted one included
    assert eligible_raw(View(version=0, tail=tuple(messages)), 0) == messages
    # A step still waiting for its result is not
    waiting = messages[:2]
    assert eligible_raw(View(version=0, tail=tuple(waiting)), 0) == []


def test_embedded_window_closes_interrupted_calls_and_keeps_log_and_view_raw() -> None:
    ctx = ContextEngine().create_context("c")
    ctx.add_messages(interrupted())
    window = ctx.get_context_window()
    assert check_window(window.get_messages()) == []
    assert [m.role for m in window.context_messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert [m.role for m in ctx.get_raw_messages()] == ["user", "assistant", "user", "assistant"]
    assert [m.role for m in ctx.get_messages()] == ["user", "assistant", "user", "assistant"]


def test_embedded_add_rejects_an_orphan_and_the_window_drops_a_restored_leading_one() -> None:
    ctx = ContextEngine().create_context("c")
    # A deviation from the reference (which accepts it): rejected, nothing stored.
    with pytest.raises(InvalidMessageError) as info:
        ctx.add_messages([A(content="hi"), T("orphan-call"), U(content="q"), A(content="a")])
    assert (info.value.index, info.value.field) == (1, "orphan_tool_result")
    assert ctx.get_raw_messages() == [] and ctx.get_messages() == []
    # A view restored with set_messages may still open with one: windows drop it, not the view.
    ctx.set_messages([A(content="hi"), T("orphan-call"), U(content="q"), A(content="a")])
    window = ctx.get_context_window()
    assert [m.text for m in window.context_messages] == ["q", "a"]
    assert len(ctx.get_messages()) == 4


def test_embedded_late_result_is_rejected_at_add_and_the_context_stays_usable() -> None:
    ctx = ContextEngine().create_context("c")
    ctx.add_messages(interrupted()[:3])
    with pytest.raises(InvalidMessageError) as info:
        ctx.add_messages([T("cancel-1", "done late")])
    assert info.value.field == "orphan_tool_result"
    assert len(ctx.get_raw_messages()) == 3
    assert check_window(ctx.get_context_window().context_messages) == []
    ctx.add_messages([A(content="ok")])
    assert ctx.get_context_window().context_messages[-1].text == "ok"


def test_embedded_window_of_a_restored_late_result_is_a_clear_error() -> None:
    ctx = ContextEngine().create_context("c")
    ctx.set_messages([*interrupted()[:3], T("cancel-1", "done late")])
    with pytest.raises(InvalidWindowError) as info:
        ctx.get_context_window()
    assert info.value.violations[0].rule == "orphan_tool_result"
    assert "set_messages" in str(info.value)


def service() -> ContextService:
    return ContextService(Settings(), MemoryStateStore(), MemoryMessageLog(), None, InlineQueue())


def test_distributed_append_accepts_the_interrupted_shape_only() -> None:
    svc = service()
    assert svc.append(KEY, interrupted()) == [f"{i:012d}" for i in range(1, 5)]
    window = svc.get_window(KEY, 5000)
    assert check_window(window.messages) == []
    assert any(getattr(m, "content", None) == INTERRUPTED_TOOL_RESULT for m in window.messages)
    # A late result for the interrupted call: 422 (an orphan), nothing written
    with pytest.raises(InvalidMessageError) as info:
        svc.append(KEY, [T("cancel-1", "late")])
    assert info.value.field == "orphan_tool_result" and info.value.index == 0
    other = ConversationKey("acme", "other")
    with pytest.raises(InvalidMessageError) as info:
        svc.append(other, [U(content="go"), A("c1"), A(content="moving on")])
    assert info.value.field == "missing_tool_result"
    with pytest.raises(InvalidMessageError):
        svc.append(other, [U(content="go"), A("c1"), T("c1"), T("c1")])  # duplicate result
    assert svc.log.last_id(KEY) == "000000000004" and svc.log.last_id(other) is None


def test_if_match_validation_sees_the_log_the_conditional_append_sees() -> None:
    svc = service()
    ids = svc.append(KEY, [U(content="run it"), A("c1")])
    # Meanwhile another writer interrupts the call
    svc.append(KEY, [U(content="actually, stop")])
    # This writer's result, sent against the log it read: a conflict (retry after reading),
    # not a 422 blaming a message that was valid where it was meant to go
    with pytest.raises(ConflictError) as info:
        svc.append(KEY, [T("c1", "done")], expected_last_id=ids[-1])
    assert info.value.last_id == "000000000003"
    # Without If-Match the same result is judged against the log as it is: an orphan
    with pytest.raises(InvalidMessageError):
        svc.append(KEY, [T("c1", "done")])


def test_if_match_replay_is_validated_as_its_first_call_was() -> None:
    svc = service()
    ids = svc.append(KEY, [U(content="run it"), A("c1")])
    batch: list[AnyMessage] = [T("c1", "done"), U(content="next")]
    batch = [m.model_copy(update={"message_id": f"m{i}"}) for i, m in enumerate(batch)]
    first = svc.append(KEY, batch, expected_last_id=ids[-1])
    svc.append(KEY, [A(content="later reply")])
    assert svc.append(KEY, batch, expected_last_id=ids[-1]) == first
    assert svc.log.last_id(KEY) == "000000000005"
