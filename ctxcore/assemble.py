"""``assemble_window``: compaction state + raw tail -> the window served to the model.

A pure function (no I/O but what the rule callable does, no model call), shared by the
distributed fast path and the evaluation harness so both measure exactly the same thing.

Guarantees, in precedence order: the window passes ``check_window`` (calls interrupted by a
later message are answered first, see ``close_interrupted_tool_calls``; anything else is
``InvalidWindowError``, never served); both anchors are in it
verbatim (or ``BudgetExceeded`` when system + tools + anchors alone are over budget); it is
within the budget. The rules see the room the tail has (the budget minus system messages,
tools, pinned anchors and blocks), so the default chain serves the raw tail verbatim while
it fits. When the blocks plus the rule-processed tail are still over budget (workers
behind), ``fit_to_budget`` shapes the served window only, never the saved state, oldest
content first: block text is truncated, then blocks are left out oldest first; then the
oldest whole tail steps are left out behind a marker naming their log-id range; then tail
texts are cut oldest first (the newest step last, anchors never); as the very last resort
only the anchors of the tail are served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxcore.counting import tolerant
from ctxcore.errors import BudgetExceeded, InvalidWindowError
from ctxcore.markers import ELIDED_STEPS
from ctxcore.messages import AnyMessage, UserMessage, message_text
from ctxcore.pipeline import PipelineConfig, View
from ctxcore.pipeline.truncate import truncate_blocks
from ctxcore.protocol import check_window, close_interrupted_tool_calls
from ctxcore.recall.auto import AutoRecall, RecallStats, recall_query, recalled_message
from ctxcore.render import head_tail
from ctxcore.state.models import CompressionState
from ctxcore.status import CompactionDetail, CompactionStatus
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector, newest_step_start, steps
from ctxcore.window import ContextStats, compute_stats

__all__ = ["CompactionStatus", "RuleFn", "WindowResult", "assemble_window", "elided_marker", "fit_to_budget"]

# (raw tail, the tokens it may use in the window or None) -> the tail to serve.
RuleFn = Callable[[Sequence[AnyMessage], int | None], list[AnyMessage]]


@dataclass
class WindowResult:
    """The served window (system messages first) and how it was made."""

    messages: list[AnyMessage]
    stats: ContextStats
    state_version: int
    compaction: CompactionStatus = "idle"
    compaction_detail: CompactionDetail = field(default_factory=CompactionDetail)
    fallback_applied: bool = False
    elided_ranges: list[tuple[str, str]] = field(default_factory=list)
    raw_tokens: int = 0
    # Every tool definition the window was counted with (the request's, then ctxcore's own).
    tools: list[dict[str, Any]] = field(default_factory=list)
    # What auto-recall added (None: off, or the fallback applied).
    recall: RecallStats | None = None


def elided_marker(first_id: str, last_id: str, count: int) -> UserMessage:
    """The note standing for tail messages left out of a served window."""
    return UserMessage(
        content=f"{ELIDED_STEPS} {count} message(s), log ids {first_id}..{last_id}, left out to fit the budget",
        metadata={"elided": {"first_id": first_id, "last_id": last_id, "count": count}},
    )


def assemble_window(
    state: CompressionState,
    tail: Sequence[AnyMessage],
    budget_tokens: int,
    system_messages: Sequence[AnyMessage],
    tools: Sequence[Mapping[str, Any]],
    rules: RuleFn | None,
    counter: TokenCounter,
    *,
    pinned: Sequence[AnyMessage] = (),
    detector: UserDetector | None = None,
    truncate_head_ratio: float = 0.2,
    auto_recall: AutoRecall | None = None,
    rule_chunk_tokens: int = 0,
) -> WindowResult:
    """Serve ``state`` + ``tail`` within ``budget_tokens`` (see the module docstring).

    ``tail`` are the raw log messages after ``state.covered_until`` and ``pinned`` the log
    messages named by ``state.pinned``; ``rules`` is the cheap rule chain applied to the tail.
    With ``auto_recall`` the room left (at most its share of the budget) holds archived
    passages near the intent (``ctxcore.recall.auto``), unless the fallback applied.

    ``rule_chunk_tokens`` (> 0) makes the rules free room in chunks of that size while the
    view is over the budget (a worker lagging behind): the room they are given is lowered to
    a whole number of chunks below the view, so the windows that follow, each one step
    longer, ask the rules for the same saving and get the same rewritten prefix until the
    next chunk is due, and a provider's prompt cache keeps serving it.
    """
    counter = tolerant(counter)  # a counter that raises must not stop the window being served
    view = View.from_state(state, tail, pinned, system=system_messages, tools=tools, detector=detector)
    anchor_ids = view.anchor_id_set()
    by_id = view.messages_by_id()
    anchor_msgs = [by_id[i] for i in sorted(anchor_ids)]
    system_tokens = counter.count_messages(list(system_messages))
    tools_tokens = counter.count_tools(list(tools))
    anchor_tokens = counter.count_messages(anchor_msgs)
    if counter.count_messages([*system_messages, *anchor_msgs]) + tools_tokens > budget_tokens:
        raise BudgetExceeded(budget_tokens, system_tokens, tools_tokens, anchor_tokens)

    raw_tokens = view.tokens(counter)
    # Answer interrupted calls before the rules and the budget see the tail: the added
    # results are part of what is served and counted.
    closed_tail = close_interrupted_tool_calls(tail)
    tail_budget_tokens = budget_tokens - replace(view, tail=()).tokens(counter)
    over = raw_tokens - budget_tokens
    if rule_chunk_tokens > 0 and over > 0:
        tail_budget_tokens -= -(-over // rule_chunk_tokens) * rule_chunk_tokens - over
    ruled_tail = list(rules(closed_tail, tail_budget_tokens)) if rules is not None else closed_tail
    unchanged = len(ruled_tail) == len(tail) and all(a is b for a, b in zip(ruled_tail, tail, strict=True))
    # The usual window (the tail fits): the view itself, whose sizes are counted already.
    current = view if unchanged else replace(view, tail=tuple(ruled_tail))
    fallback = current.tokens(counter) > budget_tokens
    elided: list[tuple[str, str]] = []
    if fallback:
        current, elided = fit_to_budget(
            current, budget_tokens, counter, anchor_ids=anchor_ids, truncate_head_ratio=truncate_head_ratio
        )

    messages = current.messages()
    context = current.context_messages()
    recalled: RecallStats | None = None
    if auto_recall is not None and not fallback:
        messages, context, recalled = _with_recall(
            auto_recall, current, messages, context, by_id, budget_tokens, counter
        )
    problems = check_window(messages)
    if problems:  # e.g. a state saved by an older version: never serve that
        raise InvalidWindowError(problems, state.version)
    stats = compute_stats(list(system_messages), context, list(tools), counter, detector)
    return WindowResult(
        messages=messages,
        stats=stats,
        state_version=state.version,
        fallback_applied=fallback,
        elided_ranges=elided,
        raw_tokens=raw_tokens,
        tools=[dict(t) for t in tools],
        recall=recalled,
    )


def _with_recall(
    auto: AutoRecall,
    current: View,
    messages: list[AnyMessage],
    context: list[AnyMessage],
    by_id: Mapping[str, AnyMessage],
    budget: int,
    counter: TokenCounter,
) -> tuple[list[AnyMessage], list[AnyMessage], RecallStats]:
    """The window with the recalled-context message between the blocks and the tail."""
    room = min(
        budget - counter.count_messages(messages) - counter.count_tools(list(current.tools)),
        int(budget * auto.max_ratio),
    )
    intent_id = current.anchor_ids()[1]
    query = recall_query(by_id.get(intent_id) if intent_id else None, current.tail, counter)
    held = frozenset(m.context_message_id for m in context if m.context_message_id)
    message, stats = recalled_message(auto, query, room, held, counter)
    if message is None:
        return messages, context, stats
    at = len(context) - len(current.tail)
    shift = len(messages) - len(context)  # the system messages before the context
    return (
        [*messages[: shift + at], message, *messages[shift + at :]],
        [*context[:at], message, *context[at:]],
        stats,
    )


def fit_to_budget(
    view: View,
    budget_tokens: int,
    counter: TokenCounter,
    *,
    anchor_ids: frozenset[str],
    truncate_head_ratio: float = 0.2,
) -> tuple[View, list[tuple[str, str]]]:
    """The served view within ``budget_tokens``, oldest content first, and the log-id ranges
    it left out (see the module docstring for the order; each step stops once it fits)."""
    elided: list[tuple[str, str]] = []
    current = view
    if current.tokens(counter) > budget_tokens and current.blocks:
        config = PipelineConfig(target_tokens=budget_tokens, truncate_head_ratio=truncate_head_ratio)
        current = replace(current, blocks=tuple(truncate_blocks(current, config, counter, budget_tokens)))
    if current.tokens(counter) > budget_tokens and current.blocks:
        blocks = list(current.blocks)
        while blocks and replace(current, blocks=tuple(blocks)).tokens(counter) > budget_tokens:
            dropped = blocks.pop(0)
            elided.append((dropped.first_id, dropped.last_id))
        current = replace(current, blocks=tuple(blocks))
    if current.tokens(counter) > budget_tokens:
        current, ranges = _elide_oldest_steps(current, anchor_ids, budget_tokens, counter)
        elided.extend(ranges)
    if current.tokens(counter) > budget_tokens:
        current, cut = _cut_tail_texts(current, anchor_ids, budget_tokens, counter, truncate_head_ratio)
        elided.extend((log_id, log_id) for log_id in cut)
    if current.tokens(counter) > budget_tokens and any(_is_marker(m) for m in current.tail):
        # Not even the note fits: serve the window without it.
        current = replace(current, tail=tuple(m for m in current.tail if not _is_marker(m)))
    if current.tokens(counter) > budget_tokens and current.tail:
        # Last resort: only the anchors are owed a place; the unfinished step goes too.
        kept = tuple(m for m in current.tail if m.context_message_id in anchor_ids)
        elided.append((current.tail[0].context_message_id or "?", current.tail[-1].context_message_id or "?"))
        current = replace(current, tail=kept)
    return current, elided


def _elide_oldest_steps(
    view: View, anchor_ids: frozenset[str], budget: int, counter: TokenCounter
) -> tuple[View, list[tuple[str, str]]]:
    """Leave out the oldest whole tail steps (never an anchor, never the newest step: the
    model is about to read it; never the in-flight step)."""
    tail = list(view.tail)
    newest = newest_step_start(tail)
    units = [s for s in steps(tail) if s.complete and s.start < newest]
    if not units:
        return view, []
    removable: list[list[int]] = []
    for step in units:
        idx = [
            i
            for i in range(step.start, step.end)
            if tail[i].context_message_id not in anchor_ids
            and not (isinstance(tail[i], UserMessage) and message_text(tail[i]).startswith(ELIDED_STEPS))
        ]
        if idx:
            removable.append(idx)
    fixed_tokens = view.tokens(counter)
    removed: set[int] = set()
    # Remove step by step, estimating the saving without re-rendering every time.
    saving = 0
    over = fixed_tokens - budget
    for idx in removable:
        if saving >= over + 64:  # leave room for the marker(s)
            break
        removed.update(idx)
        saving += counter.count_messages([tail[i] for i in idx]) - 3
    while True:
        candidate, ranges = _with_markers(tail, removed)
        trial = replace(view, tail=tuple(candidate))
        if trial.tokens(counter) <= budget or len(removed) == sum(len(i) for i in removable):
            return trial, ranges
        for idx in removable:
            if not set(idx) <= removed:
                removed.update(idx)
                break


def _with_markers(
    tail: list[AnyMessage], removed: set[int]
) -> tuple[list[AnyMessage], list[tuple[str, str]]]:
    out: list[AnyMessage] = []
    ranges: list[tuple[str, str]] = []
    i = 0
    while i < len(tail):
        if i not in removed:
            out.append(tail[i])
            i += 1
            continue
        j = i
        while j < len(tail) and j in removed:
            j += 1
        first, last = tail[i].context_message_id or "?", tail[j - 1].context_message_id or "?"
        out.append(elided_marker(first, last, j - i))
        ranges.append((first, last))
        i = j
    return out, ranges


def _is_marker(message: AnyMessage) -> bool:
    return isinstance(message, UserMessage) and "elided" in message.metadata


_CUT = "...[TRUNCATED]..."


def _cut_tail_texts(
    view: View, anchor_ids: frozenset[str], budget: int, counter: TokenCounter, head_ratio: float
) -> tuple[View, list[str]]:
    """Shorten tail texts, oldest first and the newest step last, never an anchor (served
    window only), each only as far as the window is still over; the log ids it cut."""
    tail = list(view.tail)
    newest = newest_step_start(tail)
    candidates = [
        i
        for i, m in enumerate(tail)
        if m.context_message_id not in anchor_ids and isinstance(m.content, str) and not _is_marker(m)
    ]
    order = [i for i in candidates if i < newest] + [i for i in candidates if i >= newest]
    cut_ids: list[str] = []
    # The character estimate can fall short of the tokens it must save: a few passes.
    for _ in range(3):
        for i in order:
            over = view.tokens(counter) - budget
            if over <= 0:
                return view, cut_ids
            text = message_text(tail[i])
            if text == _CUT:
                continue
            # Characters to drop, with margin: ~4 characters per token.
            keep = max(len(text) - over * 6 - 200, 0)
            cut = head_tail(text, keep, head_ratio, _CUT) if keep else _CUT
            tail[i] = tail[i].model_copy(update={"content": cut})
            view = replace(view, tail=tuple(tail))
            log_id = tail[i].context_message_id
            if log_id and log_id not in cut_ids:
                cut_ids.append(log_id)
    return view, cut_ids
