"""What each stage summarises: targets built deterministically from a view.

A target is a contiguous run of existing blocks and/or raw tail messages that becomes one
new block. Anchors (and any other pinned message) are never inside a target: targets form
on either side of them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, AssistantMessage
from ctxcore.pipeline.merge_groups import merge_groups
from ctxcore.pipeline.models import PipelineConfig, Stage, StageKind
from ctxcore.pipeline.sizing import (
    blocks_over_cap,
    header_tokens,
    item_tokens,
    message_tokens,
    room_for,
    section_tokens,
    served_of,
    served_tokens,
)
from ctxcore.pipeline.view import View, log_id
from ctxcore.state.models import SummaryBlock
from ctxcore.tokens import TokenCounter
from ctxcore.turns import adjust_keep_recent_for_tool_boundaries, newest_step_start, steps

__all__ = ["Target", "build_targets", "eligible_raw", "l1_falls_short", "targets_for_stage"]

Item = SummaryBlock | AnyMessage


@dataclass(frozen=True)
class Target:
    """A run of blocks and raw messages that one new block will stand for."""

    target_id: str
    scope: str
    blocks: tuple[SummaryBlock, ...]
    raw: tuple[AnyMessage, ...]
    level: int
    source_tokens: int
    target_tokens: int
    # What the new block stands for in raw tokens (blocks count what they stood for).
    raw_tokens: int = 0

    # Cached: stages ask for the range of a target of hundreds of messages many times.
    @cached_property
    def first_id(self) -> str:
        """First log id covered."""
        ids = [b.first_id for b in self.blocks] + [log_id(m) for m in self.raw]
        return min(ids)

    @cached_property
    def last_id(self) -> str:
        """Last log id covered."""
        ids = [b.last_id for b in self.blocks] + [log_id(m) for m in self.raw]
        return max(ids)

    def source_messages(self) -> list[AnyMessage]:
        """The messages the summary replaces, in log order."""
        return [*(m for block in self.blocks for m in block.messages), *self.raw]


def eligible_raw(view: View, keep_recent: int, *, newest_step: bool = True) -> list[AnyMessage]:
    """The tail's leading complete steps, minus the last ``keep_recent`` messages.

    Keep-recent is widened so no kept tool result loses its call; a step still waiting for
    a tool result is never summarised. With ``newest_step`` False the newest step is never
    eligible either, whatever ``keep_recent`` says (only aggressive stages may take it).
    """
    tail = list(view.tail)
    keep = adjust_keep_recent_for_tool_boundaries(tail, keep_recent) if keep_recent > 0 else 0
    limit = len(tail) - keep
    if not newest_step:
        limit = min(limit, newest_step_start(tail))
    end = 0
    for step in steps(tail):
        if step.end > limit or not step.complete:
            break
        end = step.end
    return tail[:end]


# A summary keeps at least this share of what it replaces: below it too much is lost, so
# compaction then summarises a few more old steps into a better-kept summary instead.
MIN_SUMMARY_SHARE = 0.25


def _oldest_needed(
    raw: Sequence[AnyMessage],
    need: int,
    floor: int,
    barriers: frozenset[str],
    config: PipelineConfig,
    counter: TokenCounter,
) -> list[AnyMessage]:
    """The oldest whole steps of ``raw`` to summarise so the view saves ``need`` tokens while
    the summary keeps ``floor`` tokens and ``MIN_SUMMARY_SHARE`` of them at the least; all of
    ``raw`` when even that is not enough. Anchors among them (``barriers``) stay verbatim, so
    they save nothing.

    Compaction summarises only what it must: everything newer stays verbatim in the tail.
    """

    def enough(end: int) -> bool:
        # Counted as one list and as served, as the view is (per-step sums add a reply
        # priming each; a capped result saves only what the window served of it).
        source = served_of([m for m in raw[:end] if log_id(m) not in barriers], config, counter)
        return source - need >= max(floor, source * MIN_SUMMARY_SHARE)

    return _shortest_prefix(raw, enough)


def _shortest_prefix(messages: Sequence[AnyMessage], fits: Callable[[int], bool]) -> list[AnyMessage]:
    """The fewest whole leading steps of ``messages`` whose end ``fits`` accepts; all of them
    when no end does. ``fits`` must be monotone (false, then true, as the prefix grows: a
    longer prefix saves more), so a bisection over the step ends counts O(log n) prefixes, not
    one per step: a tail of thousands of messages after a worker outage stays cheap."""
    ends = [step.end for step in steps(messages)]
    i = bisect.bisect_left(range(len(ends)), True, key=lambda k: fits(ends[k]))
    return list(messages[: ends[i]]) if i < len(ends) else list(messages)


def _segments(items: Sequence[Item], barriers: frozenset[str]) -> list[list[Item]]:
    """Split items at pinned messages and anchors (which belong to no segment)."""
    out: list[list[Item]] = [[]]
    for item in items:
        if not isinstance(item, SummaryBlock) and log_id(item) in barriers:
            out.append([])
        else:
            out[-1].append(item)
    return [seg for seg in out if seg]


def _raw_chunks(
    messages: Sequence[AnyMessage], counter: TokenCounter, chunk_tokens: int
) -> list[list[AnyMessage]]:
    """Split a run of raw messages at step ends into chunks of about ``chunk_tokens``."""
    chunks: list[list[AnyMessage]] = []
    current: list[AnyMessage] = []
    current_tokens = 0
    for step in steps(messages):
        piece = list(messages[step.start : step.end])
        tokens = message_tokens(counter, piece)
        if current and current_tokens + tokens > chunk_tokens:
            chunks.append(current)
            current, current_tokens = [], 0
        current.extend(piece)
        current_tokens += tokens
    if current:
        chunks.append(current)
    return chunks


def _scope(raw: Sequence[AnyMessage]) -> str:
    last = raw[-1] if raw else None
    if isinstance(last, AssistantMessage) and not last.tool_calls:
        return "completed_react"
    return "ongoing_react"


def _make(
    target_id: str,
    scope: str,
    items: Sequence[Item],
    level: int,
    budget: float,
    counter: TokenCounter,
    raw_tokens: int | None = None,
) -> Target:
    """``raw_tokens``: the raw items' tokens when the caller has already counted them."""
    blocks = tuple(i for i in items if isinstance(i, SummaryBlock))
    raw = tuple(i for i in items if not isinstance(i, SummaryBlock))
    if raw_tokens is None:
        raw_tokens = message_tokens(counter, raw)
    block_tokens = sum(message_tokens(counter, b.messages) for b in blocks)
    source = raw_tokens + block_tokens
    # The target is what reaching the stage target needs (no fixed ratio: a merge that must
    # save a few percent keeps the rest of its detail); callers drop targets that save nothing.
    target = max(1, int(budget))
    stood_for = raw_tokens + sum(b.tokens_before or b.tokens_after for b in blocks)
    return Target(target_id, scope, blocks, raw, level, source, target, stood_for)


def build_targets(kind: StageKind, view: View, config: PipelineConfig, counter: TokenCounter) -> list[Target]:
    """The targets ``kind`` would summarise on ``view`` (empty when it has nothing to do)."""
    # Planning a stage and running it ask for the targets of the same view: built once.
    built = view.memoized(
        ("targets", kind, config), counter, lambda: _build_targets(kind, view, config, counter)
    )
    return list(built)


def _build_targets(
    kind: StageKind, view: View, config: PipelineConfig, counter: TokenCounter
) -> list[Target]:
    first_pass, second_pass, third_pass = config.pass_targets()
    # Only the current anchors split targets: a former intent anchor pinned earlier is an
    # ordinary message now, and later merges may fold it into a block.
    barriers = view.anchor_id_set()
    header = header_tokens(counter, config)
    # Every summary carries the section headings (and "(none)" under empty ones): a fixed
    # cost per block like its header, added to each target on top of its share of the room.
    fixed = section_tokens(counter)
    all_blocks = sum(message_tokens(counter, b.messages) for b in view.blocks)

    def budget(pass_target: int, source_tokens: int, n_blocks: int, replaced_blocks: int = 0) -> int:
        # The pass target is the floor.
        return max(pass_target, room_for(view, config, counter, source_tokens, n_blocks, replaced_blocks))

    window = served_tokens(view, config, counter)
    if kind == "l0_to_l1":
        raw = eligible_raw(view, config.keep_recent_messages, newest_step=config.summarise_all_pending)
        if not config.summarise_all_pending:
            raw = _oldest_needed(
                raw, window - config.target_tokens, first_pass + header, barriers, config, counter
            )
        chunks: list[list[AnyMessage]] = []
        for segment in _segments(raw, barriers):
            chunks.extend(
                _raw_chunks(
                    [m for m in segment if not isinstance(m, SummaryBlock)], counter, config.chunk_tokens()
                )
            )
        sizes = [message_tokens(counter, c) for c in chunks]
        served = [served_of(c, config, counter) for c in chunks]
        total = sum(served) or 1
        room = budget(first_pass, total, len(chunks))
        return [
            _make(
                f"block_{n}", _scope(chunk), chunk, 1, room * part / total + fixed, counter, raw_tokens=size
            )
            for n, (chunk, size, part) in enumerate(zip(chunks, sizes, served, strict=True), 1)
        ]

    if kind == "recursive_merge":
        fold = _fold_raw(view, config, counter, barriers)
        groups = merge_groups(view, barriers, fold, lone=blocks_over_cap(view, config, counter))
        run_sizes = [item_tokens(counter, group, config) for group in groups]
        merged = sum(
            message_tokens(counter, i.messages) for g in groups for i in g if isinstance(i, SummaryBlock)
        )
        room = budget(first_pass, sum(run_sizes), len(groups), merged)
        targets = []
        for n, (group, size) in enumerate(zip(groups, run_sizes, strict=True), 1):
            lv = max(max(i.level, 1) for i in group if isinstance(i, SummaryBlock))
            share = room * size / (sum(run_sizes) or 1) + fixed
            targets.append(_make(f"merge_{lv}_{n}", "recursive_merge", group, lv + 1, share, counter))
        return [t for t in targets if t.target_tokens < t.source_tokens]

    if kind in ("aggressive_keep_recent", "aggressive_full_context"):
        keep = config.keep_recent_messages if kind == "aggressive_keep_recent" else 0
        pass_target = second_pass if kind == "aggressive_keep_recent" else third_pass
        # Even the most aggressive pass leaves the newest step verbatim: the model acts on it.
        items: list[Item] = [*view.prefix(), *eligible_raw(view, keep, newest_step=False)]
        segments = _segments(items, barriers)
        total = sum(item_tokens(counter, seg, config) for seg in segments) or 1
        room = budget(pass_target, total, len(segments), all_blocks)
        targets = []
        for n, seg in enumerate(segments, 1):
            seg_tokens = item_tokens(counter, seg, config)
            share = room * seg_tokens / total + fixed
            if len(seg) == 1 and isinstance(seg[0], SummaryBlock) and seg_tokens <= share:
                continue
            lv = max([b.level for b in seg if isinstance(b, SummaryBlock)] + [0]) + 1
            raw_part = [m for m in seg if not isinstance(m, SummaryBlock)]
            scope = _scope(raw_part) if raw_part else "existing_round_level_block"
            targets.append(_make(f"aggr_{n}", scope, seg, lv, share, counter))
        # A lone block already within its share has nothing to gain.
        return [t for t in targets if t.source_tokens > t.target_tokens * 2 or len(t.blocks) + len(t.raw) > 1]

    raise ConfigError(f"no targets for stage kind {kind!r}; pass one of the pipeline's stage kinds")


def l1_falls_short(view: View, config: PipelineConfig, counter: TokenCounter) -> bool:
    """True when the view has blocks and L0->L1 alone cannot reach the target: its room is
    below the first pass's floor, so the blocks would have to be merged right after it."""
    if not view.blocks:
        return False
    targets = build_targets("l0_to_l1", view, config, counter)
    if not targets:
        return False
    source = sum(served_of(t.raw, config, counter) for t in targets)
    return room_for(view, config, counter, source, len(targets)) < config.pass_targets()[0]


def _fold_raw(
    view: View, config: PipelineConfig, counter: TokenCounter, barriers: frozenset[str]
) -> list[AnyMessage]:
    """The raw steps a merge takes in (``merge_groups``) when L0->L1 falls short: the oldest
    whole steps L0->L1 could summarise, from the start of the tail, only until the merged
    view would be within the target (all of them when even that is not enough)."""
    if not l1_falls_short(view, config, counter):
        return []
    candidates = list(
        itertools.takewhile(
            lambda m: log_id(m) not in barriers,
            eligible_raw(view, config.keep_recent_messages, newest_step=config.summarise_all_pending),
        )
    )
    groups = merge_groups(view, barriers, lone=blocks_over_cap(view, config, counter))
    replaced = {b.block_id: b for g in groups for b in g if isinstance(b, SummaryBlock)}
    replaced.setdefault(view.blocks[-1].block_id, view.blocks[-1])
    block_tokens = sum(message_tokens(counter, b.messages) for b in replaced.values())
    gap_tokens = sum(
        item_tokens(counter, [i for i in g if not isinstance(i, SummaryBlock)], config) for g in groups
    )
    n_groups = max(len(groups), 1)
    window = served_tokens(view, config, counter)
    overhead = (header_tokens(counter, config) + section_tokens(counter)) * n_groups
    floor = config.pass_targets()[0]
    # Aim 1% below the target: a merged summary's real size differs from this estimate by a
    # few tokens, and a view that many tokens over would cost a second merge call.
    aim = config.target_tokens - config.target_tokens // 100

    def within(end: int) -> bool:
        source = block_tokens + gap_tokens + served_of(candidates[:end], config, counter)
        merged = max(floor, room_for(view, config, counter, source, n_groups, block_tokens))
        return window - source + merged + overhead <= aim

    return _shortest_prefix(candidates, within)


def targets_for_stage(
    stage: Stage, view: View, config: PipelineConfig, counter: TokenCounter
) -> list[Target]:
    """The targets of a planned stage on the view as it is now.

    The planned version guarantees the blocks are unchanged; the raw tail may have grown
    since planning (agents keep appending), so raw targets are rebuilt rather than held to
    the planned range: newly completed steps are summarised too instead of failing the stage.
    """
    wanted_blocks = set(stage.block_ids)
    return [
        t
        for t in build_targets(stage.kind, view, config, counter)
        if all(b.block_id in wanted_blocks for b in t.blocks)
    ]
