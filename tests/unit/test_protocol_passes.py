"""The one-pass protocol checks against a plain reference: the same violations, the same
repairs, on arbitrary message lists (orphans, duplicates, missing results, misplaced system
messages, in-flight tails)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from ctxcore.errors import Violation
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.protocol import check_window, close_interrupted_tool_calls


def reference_check(messages: Sequence[AnyMessage]) -> list[Violation]:
    """The rules as ``check_window`` documents them, one rule at a time."""
    out: list[Violation] = []
    seen_other = False
    for i, m in enumerate(messages):
        if isinstance(m, SystemMessage) and seen_other:
            out.append(Violation(i, "system_after_non_system", ""))
        seen_other = seen_other or not isinstance(m, SystemMessage)
    answered: dict[int, set[str]] = {}
    for i, m in enumerate(messages):
        if not isinstance(m, ToolMessage):
            continue
        j = i - 1
        while j >= 0 and isinstance(messages[j], ToolMessage):
            j -= 1
        caller = messages[j] if j >= 0 else None
        if not (isinstance(caller, AssistantMessage) and m.tool_call_id in [c.id for c in caller.tool_calls]):
            out.append(Violation(i, "orphan_tool_result", ""))
        elif m.tool_call_id in answered.setdefault(j, set()):
            out.append(Violation(i, "duplicate_tool_result", ""))
        else:
            answered[j].add(m.tool_call_id)
    for i, m in enumerate(messages):
        if isinstance(m, AssistantMessage) and m.tool_calls:
            end = i + 1
            while end < len(messages) and isinstance(messages[end], ToolMessage):
                end += 1
            missing = [c.id for c in m.tool_calls if c.id not in answered.get(i, set())]
            if missing and end < len(messages):
                out.append(Violation(i, "missing_tool_result", ", ".join(missing)))
    return sorted(out, key=lambda v: v.index)


_ids = st.sampled_from(["a", "b", "c"])
_message = st.one_of(
    st.builds(lambda: SystemMessage(content="s")),
    st.builds(lambda: UserMessage(content="u")),
    st.builds(
        lambda ids: AssistantMessage(content="", tool_calls=[ToolCall(id=i, name="bash") for i in ids]),
        st.lists(_ids, max_size=3),
    ),
    st.builds(lambda i: ToolMessage(content="r", tool_call_id=i), _ids),
)


@given(st.lists(_message, max_size=14))
def test_check_window_finds_what_the_reference_finds(messages: list[AnyMessage]) -> None:
    got = [(v.index, v.rule) for v in check_window(messages)]
    assert got == [(v.index, v.rule) for v in reference_check(messages)]


def reference_close(messages: Sequence[AnyMessage]) -> list[tuple[str, str]]:
    """(role, call id or content) of the list with each interrupted call answered right
    after its step's results, when a user or assistant message follows them."""
    out: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if isinstance(m, UserMessage | AssistantMessage) and i > 0:
            j = i - 1
            while j >= 0 and isinstance(messages[j], ToolMessage):
                j -= 1
            caller = messages[j] if j >= 0 else None
            if isinstance(caller, AssistantMessage) and caller.tool_calls:
                calls = [c.id for c in caller.tool_calls]
                got = {t.tool_call_id for t in messages[j + 1 : i] if isinstance(t, ToolMessage)}
                out += [("tool", c) for c in calls if c not in got]
        out.append((m.role, m.tool_call_id if isinstance(m, ToolMessage) else str(m.content)))
    return out


@given(st.lists(_message, max_size=14))
def test_closing_interrupted_calls_answers_what_the_reference_answers(messages: list[AnyMessage]) -> None:
    closed = close_interrupted_tool_calls(messages)
    shape = [(m.role, m.tool_call_id if isinstance(m, ToolMessage) else str(m.content)) for m in closed]
    assert shape == reference_close(messages)
    assert [m for m in closed if not m.metadata.get("interrupted")] == messages
    # Nothing a later user or assistant message interrupted is still missing its result
    assert not any(
        v.rule == "missing_tool_result" and _ended_by_turn(closed, v.index) for v in reference_check(closed)
    )


def _ended_by_turn(messages: Sequence[AnyMessage], index: int) -> bool:
    end = index + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    return end < len(messages) and isinstance(messages[end], UserMessage | AssistantMessage)
