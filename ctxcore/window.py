"""Context windows: the served message list, its statistics and windowing.

The protocol rules (``check_window``, ``close_interrupted_tool_calls``, the leading-orphan
fixes) live in ``ctxcore.protocol`` and are re-exported here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ctxcore.counting import tolerant
from ctxcore.messages import AnyMessage
from ctxcore.protocol import (
    Violation,
    check_window,
    close_interrupted_tool_calls,
    drop_leading_orphans,
    drop_leading_tool_messages,
)
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector, anchors, count_turns, turns

__all__ = [
    "DEFAULT_CONTEXT_MAX_TOKENS",
    "MODEL_CONTEXT_WINDOW_TOKENS",
    "ContextStats",
    "ContextWindow",
    "Violation",
    "apply_window_limits",
    "check_window",
    "close_interrupted_tool_calls",
    "compute_stats",
    "drop_leading_orphans",
    "drop_leading_tool_messages",
    "known_context_window",
    "resolve_context_max",
    "resolve_ratio_token_threshold",
]


@dataclass
class ContextStats:
    """Message and token counts of a window, per role."""

    total_messages: int = 0
    total_tokens: int = 0
    total_dialogues: int = 0
    system_messages: int = 0
    user_messages: int = 0
    assistant_messages: int = 0
    tool_messages: int = 0
    tools: int = 0
    system_message_tokens: int = 0
    user_message_tokens: int = 0
    assistant_message_tokens: int = 0
    tool_message_tokens: int = 0
    tool_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class ContextWindow:
    """What is sent to the model: system messages first, then context messages, plus tools.

    The lists are copied on the way in and out, so a caller cannot change a window it
    has handed over or been given.
    """

    system_messages: list[AnyMessage] = field(default_factory=list)
    context_messages: list[AnyMessage] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    statistic: ContextStats = field(default_factory=ContextStats)

    def __post_init__(self) -> None:
        self.system_messages = list(self.system_messages)
        self.context_messages = list(self.context_messages)
        self.tools = [copy.deepcopy(dict(t)) for t in self.tools]

    def get_messages(self) -> list[AnyMessage]:
        """System messages, then context messages (a new list)."""
        return [*self.system_messages, *self.context_messages]

    def get_tools(self) -> list[dict[str, Any]]:
        """Deep copies of the tool definitions."""
        return copy.deepcopy(self.tools)


def compute_stats(
    system_messages: Sequence[AnyMessage],
    context_messages: Sequence[AnyMessage],
    tools: Sequence[Mapping[str, Any]],
    counter: TokenCounter,
    detector: UserDetector | None = None,
) -> ContextStats:
    """Exact statistics of a window under ``counter``.

    ``total_tokens`` is what a request with these messages and tools costs: the figure
    every budget comparison uses. A counter that raises is estimated (``tolerant``).
    """
    counter = tolerant(counter)
    one = counter.count_message
    # Plain locals, not setattr per message: a window's statistics run on every request.
    messages = {"system": 0, "user": 0, "assistant": 0, "tool": 0}
    tokens = dict.fromkeys(messages, 0)
    for message in (*system_messages, *context_messages):
        role = message.role
        messages[role] += 1
        tokens[role] += int(one(message))
    tool_tokens = counter.count_tools(tools)
    everything = [*system_messages, *context_messages]
    # A counter that composes a request from its messages gives the total from the sums
    # just made; any other counts the request itself.
    priming = counter.reply_priming
    total = (
        sum(tokens.values()) + priming
        if priming is not None and everything
        else counter.count_messages(everything)
    )
    return ContextStats(
        total_messages=len(system_messages) + len(context_messages),
        total_tokens=total + tool_tokens,
        total_dialogues=count_turns(context_messages, detector),
        system_messages=messages["system"],
        user_messages=messages["user"],
        assistant_messages=messages["assistant"],
        tool_messages=messages["tool"],
        tools=len(tools),
        system_message_tokens=tokens["system"],
        user_message_tokens=tokens["user"],
        assistant_message_tokens=tokens["assistant"],
        tool_message_tokens=tokens["tool"],
        tool_tokens=tool_tokens,
    )


# --- windowing (spec 2.4 step 3, anchors kept) --------------------------------------------


def apply_window_limits(
    system_messages: Sequence[AnyMessage],
    context_messages: Sequence[AnyMessage],
    *,
    dialogue_round: int | None = None,
    window_size: int | None = None,
    detector: UserDetector | None = None,
) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """Cut a window to its last ``dialogue_round`` turns, then to ``window_size`` messages.

    ``window_size`` counts system messages too (spec 2.4). Deviation from the spec: the
    anchors are never dropped. A cut-off task anchor is put back at the head of the
    context messages and a cut-off intent anchor right after it; the cut never leaves a
    tool result without its call.
    """
    system = list(system_messages)
    context = list(context_messages)
    found = anchors(context, detector)
    start = 0
    if dialogue_round is not None:
        rounds = turns(context, detector)
        if rounds:
            start = rounds[-min(dialogue_round, len(rounds))].start
    if window_size is not None:
        sys_n = min(len(system), window_size)
        system = system[len(system) - sys_n :]
        keep = window_size - sys_n
        start = max(start, len(context) - keep)
    if start == 0:
        return system, context
    # Never start on a tool result whose call was cut off.
    start += len(context) - start - len(drop_leading_tool_messages(context[start:]))
    restored = [i for i in found.indices() if i < start]
    return system, [context[i] for i in restored] + context[start:]


# --- context_max ------------------------------------------------------------------------

DEFAULT_CONTEXT_MAX_TOKENS = 200_000

MODEL_CONTEXT_WINDOW_TOKENS: dict[str, int] = {
    "gpt-5.4": 1_050_000,
    "gpt-5": 400_000,
    "gpt-5-mini": 400_000,
    "gpt-5-nano": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "gemini-1.5-pro": 2_097_152,
    "gemini-2.5-pro": 1_048_576,
    "gemini-2.5-flash": 1_048_576,
}


def _lookup(table: Mapping[str, int], name: str) -> int | None:
    if name in table:
        return table[name]
    folded = name.casefold()
    return next((value for key, value in table.items() if key.casefold() == folded), None)


def known_context_window(model_name: str, table: Mapping[str, int] | None = None) -> int | None:
    """The window of ``model_name``: from ``table``, else the built-in table (also after
    stripping a ``provider/`` prefix and by the longest known prefix); None when unknown."""
    bare = model_name.rsplit("/", 1)[-1]
    found = (
        (table and _lookup(table, model_name))
        or _lookup(MODEL_CONTEXT_WINDOW_TOKENS, model_name)
        or _lookup(MODEL_CONTEXT_WINDOW_TOKENS, bare)
    )
    if found:
        return found
    bare = bare.casefold()
    prefixes = [k for k in MODEL_CONTEXT_WINDOW_TOKENS if bare.startswith(k.casefold() + "-")]
    return MODEL_CONTEXT_WINDOW_TOKENS[max(prefixes, key=len)] if prefixes else None


def resolve_context_max(
    context_window_tokens: int | None = None,
    model_name: str | None = None,
    model_context_window_tokens: Mapping[str, int] | None = None,
) -> int:
    """The model's window: explicit -> per-model map -> built-in table -> 200000 (spec 2.6).

    The built-in table also matches after stripping a ``provider/`` prefix and by the
    longest known prefix (``gpt-4o-2024-08-06`` -> ``gpt-4o``).
    """
    if isinstance(context_window_tokens, int) and context_window_tokens > 0:
        return context_window_tokens
    found = known_context_window(model_name, model_context_window_tokens) if model_name else None
    return found or DEFAULT_CONTEXT_MAX_TOKENS


def resolve_ratio_token_threshold(context_max: int, ratio: float) -> int:
    """``max(int(context_max * ratio), 1)``."""
    return max(int(context_max * ratio), 1)
