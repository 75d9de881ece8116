"""The chat protocol a served window must keep, and the repairs that keep it.

``check_window`` lists violations. The repairs apply to served windows only (the log and
the view keep the raw messages): ``close_interrupted_tool_calls`` answers calls a later
message interrupted, ``drop_leading_orphans`` removes what precedes the first user message.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.errors import Violation
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, UserMessage
from ctxcore.turns import tool_callers

__all__ = [
    "INTERRUPTED_TOOL_RESULT",
    "Violation",
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
    # Roles, not isinstance, in these loops: every served window is checked (see tool_callers).
    for i, message in enumerate(messages):
        if message.role == "system":
            if seen_other:
                violations.append(
                    Violation(i, "system_after_non_system", "system messages must all come before the others")
                )
        else:
            seen_other = True

    callers = tool_callers(messages)
    answered: dict[int, set[str]] = {}
    for i, message in enumerate(messages):
        if message.role != "tool":
            continue
        caller = callers.get(i)
        if caller is None:
            violations.append(
                Violation(
                    i,
                    "orphan_tool_result",
                    f"tool result for call {message.tool_call_id!r} does not answer a call of the "
                    "assistant message directly before it",
                )
            )
            continue
        got = answered.setdefault(caller, set())
        if message.tool_call_id in got:
            violations.append(
                Violation(i, "duplicate_tool_result", f"second result for call {message.tool_call_id!r}")
            )
        got.add(message.tool_call_id)

    for i, missing in _unanswered(messages, callers).items():
        if _results_end(messages, i) == len(messages):
            continue  # the in-flight tail: results are still to come
        violations.append(
            Violation(i, "missing_tool_result", f"tool calls without a result: {', '.join(missing)}")
        )
    violations.sort(key=lambda v: v.index)
    return violations


def _results_end(messages: Sequence[AnyMessage], i: int) -> int:
    """Index of the first non-tool message after position ``i``."""
    j = i + 1
    while j < len(messages) and messages[j].role == "tool":
        j += 1
    return j


def _unanswered(
    messages: Sequence[AnyMessage], callers: dict[int, int] | None = None
) -> dict[int, list[str]]:
    """Per assistant index: its call ids that no tool message of its step answers
    (``callers``: ``tool_callers(messages)`` when the caller has it already)."""
    answered: dict[int, set[str]] = {}
    for index, caller in (tool_callers(messages) if callers is None else callers).items():
        message = messages[index]
        if message.role == "tool":
            answered.setdefault(caller, set()).add(message.tool_call_id)
    out: dict[int, list[str]] = {}
    nothing: set[str] = set()
    for i, message in enumerate(messages):
        if message.role == "assistant" and message.tool_calls:
            got = answered.get(i, nothing)
            missing = [c.id for c in message.tool_calls if c.id not in got]
            if missing:
                out[i] = missing
    return out


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
    unanswered = _unanswered(messages)
    closing: dict[int, list[str]] = {}
    for i, missing in unanswered.items():
        j = _results_end(messages, i)
        if j < len(messages) and isinstance(messages[j], UserMessage | AssistantMessage):
            closing.setdefault(j, []).extend(missing)
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
