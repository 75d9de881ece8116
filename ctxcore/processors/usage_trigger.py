"""Usage-aware trigger counts (``usage_aware_trigger``, spec 2.5's ``usage_aware`` count).

The provider reported, with the newest assistant reply, what the request that produced it
cost (``usage_metadata.total_tokens``: system, tools, history and the reply). A trigger can
start from that figure and estimate only what came after it (``len // 4`` of the text),
instead of counting the whole window. Used for the trigger decision only: budgets, targets
and statistics stay exact counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxcore.messages import AnyMessage, AssistantMessage, message_text
from ctxcore.tokens import TokenCounter

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext
    from ctxcore.window import ContextWindow

__all__ = ["trigger_tokens", "usage_baseline", "window_trigger_tokens"]


def usage_baseline(messages: Sequence[AnyMessage], fresh_after: str | None) -> tuple[int, int] | None:
    """``(index, total_tokens)`` of the newest assistant reply with a reported usage, or None.

    A usage reported before the view was last rewritten (a compressor's ``set_messages``,
    a ``pop_messages``) describes a request the view no longer makes: only replies logged
    after ``fresh_after`` (the log id the view had reached at its last rewrite; None = never
    rewritten) count, as the reference invalidates usage on rewrite but not on append.
    """
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if not isinstance(message, AssistantMessage):
            continue
        usage = message.usage_metadata
        if usage is None or usage.total_tokens <= 0:
            continue
        log_id = message.context_message_id or ""
        if fresh_after is not None and log_id <= fresh_after:
            return None
        return i, usage.total_tokens
    return None


def trigger_tokens(
    messages: Sequence[AnyMessage],
    tools: Sequence[Mapping[str, Any]],
    counter: TokenCounter,
    *,
    usage_aware: bool,
    fresh_after: str | None = None,
) -> int:
    """Tokens a trigger compares with its threshold.

    Exact (``counter``) unless ``usage_aware`` and a fresh usage baseline exists: then the
    baseline plus ``len(text) // 4`` of each later message, tools not added again (the
    baseline already paid for them).
    """
    if usage_aware:
        found = usage_baseline(messages, fresh_after)
        if found is not None:
            index, total = found
            return total + sum(len(message_text(m)) // 4 for m in messages[index + 1 :])
    return counter.count_messages(list(messages)) + counter.count_tools(list(tools))


def window_trigger_tokens(ctx: ProcessorContext, window: ContextWindow, *, usage_aware: bool) -> int:
    """``trigger_tokens`` of a served window of ``ctx`` (its counter and usage freshness)."""
    return trigger_tokens(
        window.get_messages(),
        window.tools,
        ctx.token_counter,
        usage_aware=usage_aware,
        fresh_after=ctx.usage_fresh_after,
    )
