"""The chat protocol a served window must keep, and the repairs that keep it.

``check_window`` lists violations. The repairs apply to served windows only (the log and
the view keep the raw messages): ``close_interrupted_tool_calls`` answers calls a later
message interrupted, ``drop_leading_orphans`` removes what precedes the first user message.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.errors import Violation
from ctxcore.messages import AnyMessage, ToolMessage, UserMessage

__all__ = [
    "INTERRUPTED_TOOL_RESULT",
    "Violation",
    "append_violation",
    "check_window",
    "close_interrupted_tool_calls",
    "drop_leading_orphans",
    "drop_leading_tool_messages",
    "interrupted_by_user",
]

INTERRUPTED_TOOL_RESULT = "[Tool execution interrupted]"


def check_window(messages: Sequence[AnyMessage]) -> list[Violation]:
    """Every protocol violation in a message list as sent to a chat model.

    Rules: ``system_after_non_system``; ``orphan_tool_result`` (a tool message that does
    not answer a call of the nearest preceding assistant message, with only tool messages
    in between); ``duplicate_tool_result`` (two results for one call of one assistant
    message); ``missing_tool_result`` (a call without its result, unless its assistant
    message and results are the in-flight tail of the list).
    """
    violations: list[Violation] = []
    seen_other = False
    # One pass, roles rather than isinstance (every served window is checked): a step is an
    # assistant message and the tool messages right after it; a non-tool message ends it.
    caller = -1
    calls: Sequence[str] = ()
    answered: set[str] = set()
    for i, message in enumerate(messages):
        if message.role == "tool":
            seen_other = True
            call_id = message.tool_call_id
            if caller < 0 or call_id not in calls:
                violations.append(
                    Violation(
                        i,
                        "orphan_tool_result",
                        f"tool result for call {call_id!r} does not answer a call of the "
                        "assistant message directly before it",
                    )
                )
            elif call_id in answered:
                violations.append(
                    Violation(i, "duplicate_tool_result", f"second result for call {call_id!r}")
                )
            else:
                answered.add(call_id)
            continue
        if caller >= 0 and len(answered) < len(calls):
            _missing(violations, caller, calls, answered)
        if message.role == "system":
            if seen_other:
                violations.append(
                    Violation(i, "system_after_non_system", "system messages must all come before the others")
                )
        else:
            seen_other = True
        if message.role == "assistant" and message.tool_calls:
            caller, calls, answered = i, [c.id for c in message.tool_calls], set()
        else:
            caller, calls = (i if message.role == "assistant" else -1), ()
    # A step still open at the end is the in-flight tail: its results are still to come.
    violations.sort(key=lambda v: v.index)
    return violations


def append_violation(tail: Sequence[AnyMessage], new: Sequence[AnyMessage]) -> tuple[int, Violation] | None:
    """The first protocol violation appending ``new`` after ``tail`` would cause, with the
    position in ``new`` it is blamed on, else None.

    ``tail`` is what the new messages follow (at least the last step). An unanswered call
    followed by a user message is an interrupted step: accepted (every served window closes
    it, ``close_interrupted_tool_calls``). A violation located in the tail is caused by the
    new messages (a missing result now followed by something else): the first new message
    is blamed. Violations the tail has on its own are not the new messages' doing.
    """
    checked = [*tail, *new]
    problems = [
        p
        for p in check_window(checked)
        if not (p.rule == "missing_tool_result" and interrupted_by_user(checked, p.index))
    ]
    if problems and tail:
        before = {(v.index, v.rule) for v in check_window(tail)}
        problems = [p for p in problems if (p.index, p.rule) not in before]
    if not problems:
        return None
    first = problems[0]
    return max(first.index - len(tail), 0), first


def _missing(violations: list[Violation], caller: int, calls: Sequence[str], answered: set[str]) -> None:
    missing = [c for c in calls if c not in answered]
    if missing:
        violations.append(
            Violation(caller, "missing_tool_result", f"tool calls without a result: {', '.join(missing)}")
        )


def _results_end(messages: Sequence[AnyMessage], i: int) -> int:
    """Index of the first non-tool message after position ``i``."""
    j = i + 1
    while j < len(messages) and messages[j].role == "tool":
        j += 1
    return j


def interrupted_by_user(messages: Sequence[AnyMessage], index: int) -> bool:
    """True when the assistant at ``index`` is followed, after its results, by a user message.

    That is the shape an agent sends after the user interrupted a tool call: no result will
    come, so the step counts as complete and cancelled.
    """
    j = _results_end(messages, index)
    return j < len(messages) and isinstance(messages[j], UserMessage)


def close_interrupted_tool_calls(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """Answer each call still unanswered when a later user or assistant message follows.

    A tool result ``[Tool execution interrupted]`` with ``metadata.cancelled = True`` is
    inserted right after the step's existing results, so chat APIs accept the window; an
    unanswered call at the very end (the in-flight tail) is left alone. Served windows
    only: the log and the view keep the raw messages, and the added results have no log id.
    """
    closing: dict[int, list[str]] = {}
    # One pass, as check_window: the calls of the open step and the results it has.
    calls: Sequence[str] = ()
    answered: set[str] = set()
    for j, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id in calls:
                answered.add(message.tool_call_id)
            continue
        if len(answered) < len(calls) and message.role in ("user", "assistant"):
            missing = [c for c in calls if c not in answered]
            if missing:
                closing[j] = missing
        if message.role == "assistant" and message.tool_calls:
            calls, answered = [c.id for c in message.tool_calls], set()
        else:
            calls = ()
    if not closing:
        return list(messages)
    out: list[AnyMessage] = []
    for j, message in enumerate(messages):
        for call_id in closing.get(j, ()):
            out.append(
                ToolMessage(
                    content=INTERRUPTED_TOOL_RESULT,
                    tool_call_id=call_id,
                    metadata={"cancelled": True, "interrupted": True},
                )
            )
        out.append(message)
    return out


def drop_leading_tool_messages(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """Spec 2.4 step 5: tool results at the head have lost their call; drop them."""
    start = 0
    while start < len(messages) and isinstance(messages[start], ToolMessage):
        start += 1
    return list(messages[start:])


def drop_leading_orphans(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """Drop the tool and assistant messages before the first user message when they are orphans.

    ``[A, T(orphan), U, A]`` -> ``[U, A]``: a head that lost its user request (a cut, a bad
    import) carries results of calls that are not in the window. A head that keeps the
    protocol by itself stays (a dialogue may open with the other speaker's greeting, and
    dropping it would lose it from every window). With no user message at all only
    leading tool results go (spec 2.4 step 5).
    """
    first_user = next((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), None)
    if first_user is None:
        return drop_leading_tool_messages(messages)
    head = messages[:first_user]
    if head and (isinstance(head[0], ToolMessage) or check_window(head)):
        return list(messages[first_user:])
    return list(messages)
