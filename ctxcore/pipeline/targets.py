"""What each stage summarises: targets built deterministically from a view.

A target is a contiguous run of existing blocks and/or raw tail messages that becomes one
new block. Anchors (and any other pinned message) are never inside a target: targets form
on either side of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage
from ctxcore.pipeline.models import PipelineConfig, Stage, StageKind
from ctxcore.pipeline.view import View, block_message
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.summarize.sections import skeleton
from ctxcore.tokens import TokenCounter
from ctxcore.turns import adjust_keep_recent_for_tool_boundaries, newest_step_start, steps

__all__ = ["Target", "build_targets", "eligible_raw", "message_tokens", "served_tokens", "summary_cap"]

Item = SummaryBlock | AnyMessage


def message_tokens(counter: TokenCounter, messages: Sequence[AnyMessage]) -> int:
    """Tokens of ``messages`` (0 for none)."""
    return counter.count_messages(list(messages)) if messages else 0


def _mid(message: AnyMessage) -> str:
    assert message.context_message_id is not None
    return message.context_message_id


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
        ids = [b.first_id for b in self.blocks] + [_mid(m) for m in self.raw]
        return min(ids)

    @cached_property
    def last_id(self) -> str:
        """Last log id covered."""
        ids = [b.last_id for b in self.blocks] + [_mid(m) for m in self.raw]
        return max(ids)

    def source_messages(self) -> list[AnyMessage]:
        """The messages the summary replaces, in log order."""
        out: list[AnyMessage] = []
        for block in self.blocks:
            out.extend(block.messages)
        out.extend(self.raw)
        return out


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
    raw: Sequence[AnyMessage], need: int, floor: int, counter: TokenCounter
) -> list[AnyMessage]:
    """The oldest whole steps of ``raw`` to summarise so the view saves ``need`` tokens while
    the summary keeps ``floor`` tokens and ``MIN_SUMMARY_SHARE`` of them at the least; all of
    ``raw`` when even that is not enough.

    Compaction summarises only what it must: everything newer stays verbatim in the tail.
    """
    source = 0
    for step in steps(raw):
        source += message_tokens(counter, raw[step.start : step.end])
        if source - need >= max(floor, source * MIN_SUMMARY_SHARE):
            return list(raw[: step.end])
    return list(raw)


def served_tokens(view: View, config: PipelineConfig, counter: TokenCounter) -> int:
    """What the view costs as a window serves it: tail tool results over
    ``config.result_cap_tokens`` count at the cap (the served window caps them)."""
    total = view.tokens(counter)
    cap = config.result_cap_tokens
    if cap is None:
        return total
    for message in view.tail:
        if isinstance(message, ToolMessage):
            excess = message_tokens(counter, [message]) - cap
            if excess > 0:
                total -= excess
    return total


def summary_cap(view: View, config: PipelineConfig) -> int | None:
    """The most tokens the view's summary blocks together may take, or None for no cap.

    Only an agent's run is capped (a tool result in its tail): what it acts on next is its
    newest steps, verbatim. In a dialogue the newest turns are no more useful than what was
    said long ago, so summaries there may fill the target.
    """
    if config.summary_share >= 1 or not any(isinstance(m, ToolMessage) for m in view.tail):
        return None
    return int(config.target_tokens * config.summary_share)


def _segments(items: Sequence[Item], barriers: frozenset[str]) -> list[list[Item]]:
    """Split items at pinned messages and anchors (which belong to no segment)."""
    out: list[list[Item]] = [[]]
    for item in items:
        if not isinstance(item, SummaryBlock) and _mid(item) in barriers:
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


def _merge_runs(
    blocks: Sequence[SummaryBlock], barriers_between: set[tuple[str, str]]
) -> list[list[SummaryBlock]]:
    """Spec 4.5 recursive-merge grouping: promote lonely levels, then runs at the lowest level."""
    if len(blocks) < 2:
        return []
    level = {b.block_id: max(b.level, 1) for b in blocks}
    while True:
        levels = sorted(set(level.values()))
        promoted = False
        for lower, higher in itertools.pairwise(levels):
            members = [bid for bid, lv in level.items() if lv == lower]
            if len(members) == 1:
                level[members[0]] = higher
                promoted = True
                break
        if not promoted:
            break
    counts: dict[int, int] = {}
    for lv in level.values():
        counts[lv] = counts.get(lv, 0) + 1
    candidates = sorted(lv for lv, n in counts.items() if n >= 2)
    if not candidates:
        return []
    chosen = candidates[0]
    runs: list[list[SummaryBlock]] = []
    previous: SummaryBlock | None = None
    for block in blocks:
        contiguous = previous is not None and (previous.block_id, block.block_id) not in barriers_between
        if level[block.block_id] != chosen:
            previous = None
            continue
        if contiguous and runs and runs[-1][-1] is previous:
            runs[-1].append(block)
        else:
            runs.append([block])
        previous = block
    return [run for run in runs if len(run) >= 2]


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
    window = served_tokens(view, config, counter)
    header = _header_tokens(counter, config)
    # Every summary carries the section headings (and "(none)" under empty ones): a fixed
    # cost per block like its header, added to each target on top of its share of the room.
    fixed = counter.count_text(skeleton(BLOCK_SECTIONS))

    all_blocks = sum(message_tokens(counter, b.messages) for b in view.blocks)
    cap = summary_cap(view, config)

    def budget(pass_target: int, source_tokens: int, n_blocks: int, replaced_blocks: int = 0) -> int:
        # Summaries may use the room left under the target, so a pass lands near the target
        # instead of far below it (less detail lost), but in an agent's run all blocks
        # together stay within their cap so the tail keeps the rest; the pass target is the
        # floor. Each new block's header is paid out of the room.
        room = config.target_tokens - (window - source_tokens)
        if cap is not None:
            room = min(room, cap - (all_blocks - replaced_blocks))
        return max(pass_target, room - header * n_blocks)

    if kind == "l0_to_l1":
        raw = eligible_raw(view, config.keep_recent_messages, newest_step=config.summarise_all_pending)
        if not config.summarise_all_pending:
            raw = _oldest_needed(raw, window - config.target_tokens, first_pass + header, counter)
        chunks: list[list[AnyMessage]] = []
        for segment in _segments(raw, barriers):
            chunks.extend(
                _raw_chunks(
                    [m for m in segment if not isinstance(m, SummaryBlock)], counter, config.chunk_tokens()
                )
            )
        sizes = [message_tokens(counter, c) for c in chunks]
        total = sum(sizes) or 1
        room = budget(first_pass, total, len(chunks))
        return [
            _make(
                f"block_{n}", _scope(chunk), chunk, 1, room * size / total + fixed, counter, raw_tokens=size
            )
            for n, (chunk, size) in enumerate(zip(chunks, sizes, strict=True), 1)
        ]

    if kind == "recursive_merge":
        between: set[tuple[str, str]] = set()
        gaps: dict[tuple[str, str], list[AnyMessage]] = {}
        last_block: SummaryBlock | None = None
        separated = False
        gap: list[AnyMessage] = []
        for item in view.prefix():
            if isinstance(item, SummaryBlock):
                if last_block is not None:
                    if separated:
                        between.add((last_block.block_id, item.block_id))
                    elif gap:
                        gaps[(last_block.block_id, item.block_id)] = gap
                last_block, separated, gap = item, False, []
            elif _mid(item) in barriers:
                separated = True
            else:
                gap.append(item)
        runs = _merge_runs(list(view.blocks), between)
        run_items: list[list[Item]] = []
        for run in runs:
            items_of_run: list[Item] = [run[0]]
            for previous, block in itertools.pairwise(run):
                items_of_run.extend(gaps.get((previous.block_id, block.block_id), []))
                items_of_run.append(block)
            run_items.append(items_of_run)
        run_sizes = [_item_tokens(counter, group) for group in run_items]
        merged = sum(message_tokens(counter, b.messages) for run in runs for b in run)
        room = budget(first_pass, sum(run_sizes), len(runs), merged)
        targets = []
        for n, (run, group, size) in enumerate(zip(runs, run_items, run_sizes, strict=True), 1):
            lv = max(max(b.level, 1) for b in run)
            share = room * size / (sum(run_sizes) or 1) + fixed
            targets.append(_make(f"merge_{lv}_{n}", "recursive_merge", group, lv + 1, share, counter))
        return [t for t in targets if t.target_tokens < t.source_tokens]

    if kind in ("aggressive_keep_recent", "aggressive_full_context"):
        keep = config.keep_recent_messages if kind == "aggressive_keep_recent" else 0
        pass_target = second_pass if kind == "aggressive_keep_recent" else third_pass
        # Even the most aggressive pass leaves the newest step verbatim: the model acts on it.
        items: list[Item] = [*view.prefix(), *eligible_raw(view, keep, newest_step=False)]
        segments = _segments(items, barriers)
        total = sum(_item_tokens(counter, seg) for seg in segments) or 1
        room = budget(pass_target, total, len(segments), all_blocks)
        targets = []
        for n, seg in enumerate(segments, 1):
            seg_tokens = _item_tokens(counter, seg)
            share = room * seg_tokens / total + fixed
            if len(seg) == 1 and isinstance(seg[0], SummaryBlock) and seg_tokens <= share:
                continue
            lv = max([b.level for b in seg if isinstance(b, SummaryBlock)] + [0]) + 1
            raw_part = [m for m in seg if not isinstance(m, SummaryBlock)]
            scope = _scope(raw_part) if raw_part else "existing_round_level_block"
            targets.append(_make(f"aggr_{n}", scope, seg, lv, share, counter))
        # A lone block already within its share has nothing to gain.
        return [t for t in targets if t.source_tokens > t.target_tokens * 2 or len(t.blocks) + len(t.raw) > 1]

    raise ValueError(f"no targets for stage kind {kind!r}")


def _header_tokens(counter: TokenCounter, config: PipelineConfig) -> int:
    """Tokens a block message costs beyond its summary's lines (its sections' headings included)."""
    probe = block_message(
        skeleton(BLOCK_SECTIONS),
        block_id="L1-000000000000-000000000000",
        first_id="000000000000",
        last_id="000000000000",
        level=1,
        scope="completed_react",
        marker=config.compression_marker,
    )
    return message_tokens(counter, [probe])


def _item_tokens(counter: TokenCounter, items: Sequence[Item]) -> int:
    total = 0
    for item in items:
        total += message_tokens(counter, item.messages if isinstance(item, SummaryBlock) else [item])
    return total


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
