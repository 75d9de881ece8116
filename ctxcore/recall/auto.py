"""Auto-recall: a window spends its leftover room on the archived passages nearest the intent.

After system messages, tools, anchors, blocks and the ruled tail, the room left (at most
``max_ratio`` of the budget) takes one user-role message, ``[CTXCORE_RECALLED_CONTEXT]``,
at the end of the window (``recall_position``). Its query is deterministic: the intent anchor (192
tokens), the newest assistant text (192) and the head of the newest tool output (128), at
most 512 tokens. Passages (message-aligned, at most the archive's passage size) come from
the three best chunks and are ranked within them by the same bm25; what the window holds
verbatim is skipped; the best are added while they fit, then printed in log order, each
headed by its log-id range. The message is served only: never pinned, saved, logged or
counted in the trigger.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.markers import RECALLED_CONTEXT
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, UserMessage, message_text
from ctxcore.recall.index import IndexedText, RecallIndex, query_words
from ctxcore.tokens import TokenCounter
from ctxcore.turns import newest_step_start

__all__ = ["AutoRecall", "RecallStats", "recall_position", "recall_query", "recalled_message"]

QUERY_PARTS = ((192, "intent"), (192, "assistant"), (128, "tool"))
BEST_CHUNKS = 3
# What a passage's "[log ids <first>-<last>]" header and separating blank line cost.
_HEADER_TOKENS = 16


@dataclass(frozen=True)
class AutoRecall:
    """What a window needs to spend its headroom on recall: the index and the share cap."""

    index: RecallIndex
    max_ratio: float = 0.25


@dataclass(frozen=True)
class RecallStats:
    """What auto-recall added to a window."""

    passages: int
    tokens: int
    query_ms: float


def _head(text: str, tokens: int, counter: TokenCounter) -> str:
    if counter.count_text(text) <= tokens:
        return text
    keep = len(text) * tokens // max(counter.count_text(text), 1)
    while keep > 0 and counter.count_text(text[:keep]) > tokens:
        keep = keep * 9 // 10
    return text[:keep]


def recall_query(intent: AnyMessage | None, tail: Sequence[AnyMessage], counter: TokenCounter) -> str:
    """The deterministic auto-recall query (see the module docstring)."""
    assistant = next(
        (m for m in reversed(tail) if isinstance(m, AssistantMessage) and message_text(m).strip()), None
    )
    tool = next((m for m in reversed(tail) if isinstance(m, ToolMessage) and message_text(m).strip()), None)
    sources = {"intent": intent, "assistant": assistant, "tool": tool}
    parts = [
        _head(message_text(m), limit, counter)
        for limit, name in QUERY_PARTS
        if (m := sources[name]) is not None
    ]
    return "\n".join(p for p in parts if p.strip())


def recall_position(context: Sequence[AnyMessage]) -> int:
    """Where the recalled-context message goes in ``context``: last, or before the step still
    in flight at its end (an assistant message whose calls are not all answered yet).

    Last, because the passages follow the newest activity and change with every window: put
    before the tail, they made every window a new prefix for a provider's prompt cache from
    there on (shared prefix 0.52-0.59 against 0.75-0.84 last, at the same next-step
    references: bench/README.md, "Auto-recall at the end of the window").
    """
    newest = newest_step_start(context)
    step = context[newest] if newest < len(context) else None
    results = context[newest + 1 :]
    if not isinstance(step, AssistantMessage) or not all(isinstance(m, ToolMessage) for m in results):
        return len(context)
    answered = {m.tool_call_id for m in results if isinstance(m, ToolMessage)}
    return newest if any(c.id not in answered for c in step.tool_calls) else len(context)


def recalled_message(
    auto: AutoRecall,
    query: str,
    room: int,
    held_ids: frozenset[str],
    counter: TokenCounter,
) -> tuple[UserMessage | None, RecallStats]:
    """The recalled-context message within ``room`` tokens (None when nothing fits or matches)."""
    started = time.perf_counter()
    words = query_words(query)
    chunks = auto.index.search(words, limit=BEST_CHUNKS)
    candidates = [
        p
        for p in auto.index.passages(words, chunks)
        if not (p.first_id in held_ids and p.last_id in held_ids)
    ]
    elapsed = (time.perf_counter() - started) * 1000
    # Each passage's own count is stored: add the best while their sum (plus its range header)
    # fits, then count the one message built, dropping the last added while it is over.
    chosen: list[IndexedText] = []
    used = counter.count_messages([_render([])])
    for passage in candidates:
        cost = passage.tokens + _HEADER_TOKENS
        if used + cost <= room:
            chosen.append(passage)
            used += cost
    message: UserMessage | None = None
    while chosen:
        message = _render(sorted(chosen, key=lambda p: (p.first_id, p.part)))
        if counter.count_messages([message]) <= room:
            break
        chosen.pop()
        message = None
    tokens = counter.count_messages([message]) if message is not None else 0
    return message, RecallStats(len(chosen), tokens, elapsed)


def _render(passages: Sequence[IndexedText]) -> UserMessage:
    body = "\n\n".join(f"[log ids {p.range_id}]\n{p.text}" for p in passages)
    return UserMessage(
        # Last in the window, the model reads it right before it answers: it must not pass
        # for the user's next request.
        content=(
            f"{RECALLED_CONTEXT} Archived originals of earlier messages, retrieved for the current "
            "work. Reference only, not a new request: continue from the conversation above.\n\n"
            f"{body}"
        ),
        metadata={"recalled": [p.range_id for p in passages]},
    )
