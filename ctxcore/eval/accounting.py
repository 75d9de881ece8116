"""Where a window's budget goes, and what a provider's prompt cache reuses of it.

Each message of a served window falls in one part of the budget: ``system_tools`` (system
messages, tool definitions and the request's priming), ``anchors`` (the task and intent
anchors, verbatim), ``blocks`` (summary blocks), ``raw`` (log messages served verbatim),
``rewritten`` (log messages a rule or a baseline changed: offload markers and previews,
cleared or cut results, reduced tool turns, the fallback's note of left-out steps) and
``recall`` (archived passages); ``unused`` is what is left of the budget.

A provider's prefix cache reuses a request up to its first changed part: the tool
definitions, then the messages in order. ``CacheTracker`` counts, for each window of a
replay, the tokens of the leading messages (tools included) equal to the previous window's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxcore.markers import ELIDED_STEPS, INTERNAL_USER_PREFIXES, RECALLED_CONTEXT
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolMessage, message_text
from ctxcore.pipeline.view import BLOCK_META

__all__ = ["PARTS", "CacheTracker", "RawMessages", "WindowCosts", "message_key", "parts", "tools_key"]

PARTS = ("system_tools", "anchors", "blocks", "raw", "rewritten", "recall", "unused")
_BLOCK_PREFIXES = tuple(p for p in INTERNAL_USER_PREFIXES if p not in (ELIDED_STEPS, RECALLED_CONTEXT))

MessageKey = tuple[str, str, str | None, tuple[tuple[str, str, str], ...]]


def message_key(message: AnyMessage) -> MessageKey:
    """What makes two messages the same request text: role, content, call id and calls."""
    calls = (
        tuple((c.id, c.name, c.arguments) for c in message.tool_calls)
        if isinstance(message, AssistantMessage)
        else ()
    )
    call_id = message.tool_call_id if isinstance(message, ToolMessage) else None
    return (message.role, message_text(message), call_id, calls)


@dataclass
class RawMessages:
    """The raw messages appended so far (keys), and which of them are anchors."""

    keys: set[MessageKey] = field(default_factory=set)
    anchors: set[MessageKey] = field(default_factory=set)

    def add(self, messages: Iterable[AnyMessage]) -> None:
        """Remember appended raw messages."""
        self.keys.update(message_key(m) for m in messages)

    def set_anchors(self, messages: Iterable[AnyMessage]) -> None:
        """The current anchors (the intent anchor moves with each real user message)."""
        self.anchors = {message_key(m) for m in messages}


@dataclass
class WindowCosts:
    """A served window's messages with what each adds to the request, and the rest of it."""

    messages: Sequence[AnyMessage]
    costs: list[int]
    tools_tokens: int
    total: int
    tools_key: str


def _part(message: AnyMessage, key: MessageKey, raw: RawMessages) -> str:
    if isinstance(message, SystemMessage):
        return "system_tools"
    if key in raw.anchors:
        return "anchors"
    if key in raw.keys:
        return "raw"
    if BLOCK_META in message.metadata:
        return "blocks"
    text = message_text(message)
    if text.startswith(RECALLED_CONTEXT):
        return "recall"
    if text.startswith(_BLOCK_PREFIXES):
        return "blocks"
    return "rewritten"


def parts(window: WindowCosts, raw: RawMessages, budget: int) -> dict[str, int]:
    """Tokens of each part of the budget (``PARTS``); ``unused`` may be negative when over."""
    out = dict.fromkeys(PARTS, 0)
    out["system_tools"] = window.total - sum(window.costs)  # tools and the request's priming
    for message, cost in zip(window.messages, window.costs, strict=True):
        out[_part(message, message_key(message), raw)] += cost
    out["unused"] = budget - window.total
    return out


@dataclass
class CacheTracker:
    """Shared-prefix tokens of each window with the one before it, in one replay."""

    previous: list[MessageKey] | None = None
    previous_tools: str | None = None

    def shared(self, window: WindowCosts) -> int:
        """Tokens of ``window`` a prefix cache filled by the previous window sent would serve;
        the window becomes the previous one. The first window of a replay shares nothing; a
        window that raised was never sent and is not passed here."""
        keys = [message_key(m) for m in window.messages]
        shared = 0
        if self.previous is not None and self.previous_tools == window.tools_key:
            shared = window.tools_tokens
            for mine, theirs, cost in zip(keys, self.previous, window.costs, strict=False):
                if mine != theirs:
                    break
                shared += cost
        self.previous, self.previous_tools = keys, window.tools_key
        return shared


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool definitions as the text a request carries (for prefix comparison)."""
    return json.dumps(list(tools), sort_keys=True, default=str)
