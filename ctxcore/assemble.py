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
from ctxcore.pipeline.view import log_id
from ctxcore.protocol import check_window, close_interrupted_tool_calls
from ctxcore.recall.auto import AutoRecall, RecallStats, recall_position, recall_query, recalled_message
from ctxcore.render import head_tail
from ctxcore.state.models import CompressionState
from ctxcore.status import CompactionDetail, CompactionStatus
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector, newest_step_start, steps
from ctxcore.window import ContextStats, compute_stats

__all__ = ["CompactionStatus", "RuleFn", "WindowResult", "assemble_window", "elided_marker", "fit_to_budget"]

# (raw tail, the tokens it may use in the window or None, the chunk the rules free room in
# while over it, 0 for none) -> the tail to serve.
RuleFn = Callable[[Sequence[AnyMessage], int | None, int], list[AnyMessage]]


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
    view is over the budget (a worker lagging behind), passed to ``rules`` with the room
    (``apply_rules_result``'s ``chunk_tokens``).
    """
    counter = tolerant(counter)  # a counter that raises must not stop the window being served
    view = View.from_state(state, tail, pinned, system=system_messages, tools=tools, detector=detector)
    anchor_ids = view.anchor_id_set()
    by_id = view.messages_by_id()
    anchor_msgs = [by_id[i] for i in sorted(anchor_ids)]
    tools_tokens = counter.count_tools(list(tools))
    if counter.count_messages([*system_messages, *anchor_msgs]) + tools_tokens > budget_tokens:
        raise BudgetExceeded(
            budget_tokens,
            counter.count_messages(list(system_messages)),
            tools_tokens,
            counter.count_messages(anchor_msgs),
        )

    raw_tokens = view.tokens(counter)
    # Answer interrupted calls before the rules and the budget see the tail: the added
    # results are part of what is served and counted.
    closed_tail = close_interrupted_tool_calls(tail)
    tail_budget_tokens = budget_tokens - replace(view, tail=()).tokens(counter)
    ruled_tail = (
        list(rules(closed_tail, tail_budget_tokens, rule_chunk_tokens)) if rules is not None else closed_tail
    )
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
    return WindowResult(
        messages=messages,
        stats=compute_stats(list(system_messages), context, list(tools), counter, detector),
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
    """The window with the recalled-context message where ``recall_position`` puts it."""
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
    at = recall_position(context)
    shift = len(messages) - len(context)  # the system messages before the context
    return (
        [*messages[: shift + at], message, *messages[shift + at :]],
        [*context[:at], message, *context[at:]],
        stats,
    )


@dataclass(frozen=True)
class _Fit:
    """What every fallback step works to: the budget, the counter and what it must keep."""

    budget_tokens: int
    counter: TokenCounter
    anchor_ids: frozenset[str]
    truncate_head_ratio: float

    def over(self, view: View) -> int:
        return view.tokens(self.counter) - self.budget_tokens


Elided = list[tuple[str, str]]
# One fallback step: the view a little smaller (or as it was, when the step has nothing to
# act on) and the log-id ranges it left out.
FallbackStep = Callable[[View, _Fit], tuple[View, Elided]]


def _truncate_blocks(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Block text cut, head and tail kept (the hard-truncate stage's way, served only)."""
    if not view.blocks:
        return view, []
    config = PipelineConfig(target_tokens=fit.budget_tokens, truncate_head_ratio=fit.truncate_head_ratio)
    return replace(view, blocks=tuple(truncate_blocks(view, config, fit.counter, fit.budget_tokens))), []


def _drop_oldest_blocks(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Whole blocks left out, oldest first, until the rest fits."""
    blocks, elided = list(view.blocks), []
    while blocks and fit.over(replace(view, blocks=tuple(blocks))) > 0:
        dropped = blocks.pop(0)
        elided.append((dropped.first_id, dropped.last_id))
    return replace(view, blocks=tuple(blocks)), elided


def _drop_pinned(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Raw messages a compaction left pinned between its blocks (not the anchors) left out,
    oldest first, until the rest fits. No other step touches them: without this one the last
    step kept them and the window stayed over its budget. Run after the tail's steps, not as
    the oldest content right after the blocks: that cost tau-bench (60 runs at 0.5, lag 0)
    a reference, 0.650 -> 0.646; here every window that fitted before is served as before."""
    pinned, elided = list(view.pinned), []
    for message in view.pinned:
        if fit.over(replace(view, pinned=tuple(pinned))) <= 0:
            break
        mid = log_id(message)
        if mid not in fit.anchor_ids:
            pinned.remove(message)
            elided.append((mid, mid))
    return replace(view, pinned=tuple(pinned)), elided


def _drop_markers(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Not even the notes standing for left-out steps fit: the window is served without them."""
    return replace(view, tail=tuple(m for m in view.tail if not _is_marker(m))), []


def _anchors_only(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Last resort: only the anchors are owed a place; the unfinished step goes too."""
    if not view.tail:
        return view, []
    kept = tuple(m for m in view.tail if m.context_message_id in fit.anchor_ids)
    first, last = view.tail[0].context_message_id or "?", view.tail[-1].context_message_id or "?"
    return replace(view, tail=kept), [(first, last)]


def fit_to_budget(
    view: View,
    budget_tokens: int,
    counter: TokenCounter,
    *,
    anchor_ids: frozenset[str],
    truncate_head_ratio: float = 0.2,
) -> tuple[View, list[tuple[str, str]]]:
    """The served view within ``budget_tokens`` and the log-id ranges it left out: the steps
    of ``FALLBACK_STEPS`` in order, oldest content first, each only while the view is over."""
    fit = _Fit(budget_tokens, counter, anchor_ids, truncate_head_ratio)
    elided: Elided = []
    for _, step in FALLBACK_STEPS:
        if fit.over(view) <= 0:
            break
        view, ranges = step(view, fit)
        elided.extend(ranges)
    return view, elided


# A removed step's messages were counted as a request of their own: less its reply priming.
_PRIMING = 3
# Room left for the marker(s) standing for the removed steps (one is about 35 tokens).
MARKER_ROOM_TOKENS = 64


def _elide_oldest_steps(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Leave out the oldest whole tail steps behind a marker naming their log-id range (never
    an anchor, never the newest step: the model is about to read it; never the in-flight step)."""
    tail = list(view.tail)
    newest = newest_step_start(tail)
    removable: list[list[int]] = []
    for step in steps(tail):
        # The newest step may open with the user's message (a step runs from the message
        # after the previous step to its last result): whatever it starts with, it stays.
        if not step.complete or step.end > newest:
            continue
        idx = [
            i
            for i in range(step.start, step.end)
            if tail[i].context_message_id not in fit.anchor_ids
            and not (isinstance(tail[i], UserMessage) and message_text(tail[i]).startswith(ELIDED_STEPS))
        ]
        if idx:
            removable.append(idx)
    if not removable:
        return view, []
    removed: set[int] = set()
    # Remove step by step, estimating the saving without re-rendering every time.
    saving, over = 0, fit.over(view)
    for idx in removable:
        if saving >= over + MARKER_ROOM_TOKENS:
            break
        removed.update(idx)
        saving += fit.counter.count_messages([tail[i] for i in idx]) - _PRIMING
    while True:
        candidate, ranges = _with_markers(tail, removed)
        trial = replace(view, tail=tuple(candidate))
        if fit.over(trial) <= 0:
            return trial, ranges
        if len(removed) == sum(len(i) for i in removable):
            # Steps smaller than their marker: leaving them out would only grow the window.
            return (trial, ranges) if fit.over(trial) < over else (view, [])
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
# Tokens the cut mark and its line breaks take.
CUT_MARK_TOKENS = 8
# Characters more per cut: the head/tail split may land where a token ends later.
CUT_SLACK_CHARS = 16
# Cuts of one text: the estimate from its own characters per token can fall a little short
# (code and JSON tokenise unevenly), and each further cut frees what is still over.
CUT_PASSES = 3


def _cut_tail_texts(view: View, fit: _Fit) -> tuple[View, Elided]:
    """Shorten tail texts, oldest first and the newest step last, never an anchor (served
    window only), each only as far as the window is still over; the log ids it cut."""
    tail = list(view.tail)
    newest = newest_step_start(tail)
    candidates = [
        i for i, m in enumerate(tail) if m.context_message_id not in fit.anchor_ids and not _is_marker(m)
    ]
    order = [i for i in candidates if i < newest] + [i for i in candidates if i >= newest]
    cut_ids: list[str] = []
    for i in order:
        if fit.over(view) <= 0:
            break
        view = _cut_text(view, tail, i, fit)
        log_id = tail[i].context_message_id
        if log_id and log_id not in cut_ids:
            cut_ids.append(log_id)
    return view, [(c, c) for c in cut_ids]


def _cut_text(view: View, tail: list[AnyMessage], i: int, fit: _Fit) -> View:
    """``view`` with ``tail[i]``'s text cut (head and tail kept) by what the window is over,
    in that text's own characters per token: a fixed ratio cut a short result the newest step
    needed down to nothing when it was a few dozen tokens over."""
    original = message_text(tail[i])
    chars_per_token = len(original) / max(fit.counter.count_text(original), 1)
    keep = len(original)
    for _ in range(CUT_PASSES):
        over = fit.over(view)
        if over <= 0:
            break
        keep = int(keep - (over + CUT_MARK_TOKENS) * chars_per_token) - CUT_SLACK_CHARS
        cut = head_tail(original, keep, fit.truncate_head_ratio, _CUT) if keep > 0 else _CUT
        tail[i] = tail[i].model_copy(update={"content": cut})
        view = replace(view, tail=tuple(tail))
        if keep <= 0:
            break
    return view


# The fallback, in order: what each step leaves out is older or less needed than the next's.
FALLBACK_STEPS: tuple[tuple[str, FallbackStep], ...] = (
    ("truncate blocks", _truncate_blocks),
    ("drop oldest blocks", _drop_oldest_blocks),
    ("elide oldest tail steps", _elide_oldest_steps),
    ("cut tail texts", _cut_tail_texts),
    ("drop elided markers", _drop_markers),
    ("drop pinned non-anchors", _drop_pinned),
    ("serve the anchors only", _anchors_only),
)
