"""Which blocks a recursive merge folds together, with the raw messages each group takes.

A group is a contiguous run of blocks (spec 4.5: lonely levels promoted, then runs at the
lowest level) and the raw messages lying between them. A merge may also fold in the oldest
raw steps of the tail when L0->L1 alone could not reach the target: summarising those
steps into an L1 block that a merge would fold again at once costs two model calls and
sends the steps twice, where one merge over the blocks and the steps costs one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from ctxcore.messages import AnyMessage
from ctxcore.pipeline.view import View, log_id
from ctxcore.state.models import SummaryBlock

__all__ = ["MergeGroup", "merge_groups"]

Item = SummaryBlock | AnyMessage
MergeGroup = list[Item]


def merge_groups(
    view: View, barriers: frozenset[str], fold: Sequence[AnyMessage] = (), *, lone: bool = False
) -> list[MergeGroup]:
    """The groups a recursive merge of ``view`` summarises, in log order, each in log order.

    ``fold``: the tail's oldest raw steps to take as well. They join the group ending with
    the view's newest block (a group of that block alone when no run ends there), and only
    when nothing pinned lies between that block and the tail; otherwise they are left out.

    ``lone`` (the blocks are over their cap): a block that no other block shares a stretch
    between pinned messages with, so no run can take it, is a group of its own,
    re-summarised to its share. A user's new request is pinned as the intent anchor: without
    this the summary of the work before it kept the whole cap, the work after it was held at
    the pass floor beside it (0.59 of the target where the cap is 0.4), and tighter budgets
    escalated to the aggressive passes (bench/README, "Coding sessions with a follow-up
    request").
    """
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
        elif log_id(item) in barriers:
            separated = True
        else:
            gap.append(item)
    blocks = list(view.blocks)
    runs = _merge_runs(blocks, between)
    if lone:
        bounds = [True, *((a.block_id, b.block_id) in between for a, b in itertools.pairwise(blocks)), True]
        alone = [[b] for n, b in enumerate(blocks) if bounds[n] and bounds[n + 1]]
        order = {b.block_id: n for n, b in enumerate(blocks)}
        runs = sorted([*runs, *alone], key=lambda run: order[run[0].block_id])
    groups: list[MergeGroup] = []
    for run in runs:
        group: MergeGroup = [run[0]]
        for previous, block in itertools.pairwise(run):
            group.extend(gaps.get((previous.block_id, block.block_id), []))
            group.append(block)
        groups.append(group)
    # The prefix must end with the newest block: a pinned message after it would sit inside
    # the merged range.
    prefix = view.prefix()
    if fold and view.blocks and prefix and prefix[-1] is view.blocks[-1]:
        newest = view.blocks[-1]
        owner = next((g for g in groups if g[-1] is newest), None)
        if owner is None:
            owner = [newest]
            groups.append(owner)
        owner.extend(fold)
    return groups


def _merge_runs(
    blocks: Sequence[SummaryBlock], barriers_between: set[tuple[str, str]]
) -> list[list[SummaryBlock]]:
    """Spec 4.5 recursive-merge grouping: promote lonely levels, then runs at the lowest level."""
    if len(blocks) < 2:
        return []
    level = {b.block_id: max(b.level, 1) for b in blocks}
    while True:
        levels = sorted(set(level.values()))
        for lower, higher in itertools.pairwise(levels):
            members = [bid for bid, lv in level.items() if lv == lower]
            if len(members) == 1:
                level[members[0]] = higher
                break
        else:  # no level was promoted
            break
    counts = Counter(level.values())
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
