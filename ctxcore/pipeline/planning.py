"""Planning: the next stage to run on a ``View``, in the fixed order L0->L1, recursive
merge, aggressive keep-recent, aggressive full-context, hard truncate (merges first while
the summary blocks are over their share of the target)."""

from __future__ import annotations

from collections.abc import Collection

from ctxcore.pipeline.models import STAGE_ORDER, PipelineConfig, Stage, StageKind
from ctxcore.pipeline.sizing import blocks_over_cap, held_tokens, served_tokens
from ctxcore.pipeline.targets import build_targets, l1_falls_short
from ctxcore.pipeline.view import View
from ctxcore.tokens import TokenCounter

__all__ = ["MIN_L1_SOURCE_TOKENS", "plan_next_stage"]

# Below this many raw tokens an L1 block's header would cost more than it saves.
MIN_L1_SOURCE_TOKENS = 200


def plan_next_stage(
    view: View, config: PipelineConfig, counter: TokenCounter, *, exhausted: Collection[str] = ()
) -> Stage | None:
    """The next stage to run on ``view``, or None when it is within target or nothing can help
    (the newest step and the anchors alone are over the budget, ``config.ceiling_tokens``).

    ``exhausted`` lists stage kinds that already failed to improve this view; they are
    skipped so the pipeline escalates instead of repeating itself.
    """
    served = served_tokens(view, config, counter)
    if served <= config.target_tokens:
        return None
    ceiling = config.ceiling_tokens
    if ceiling is not None and held_tokens(view, config, counter) > ceiling:
        # The newest step and the anchors alone are over the budget: every stage would be a
        # model call that cannot make the view fit (tau-bench at half of each run: 995
        # summariser calls for 60 runs with them, 527 without, references 0.527 -> 0.531).
        # The worker's ``newest_step`` hold says why; the window's fallback fits the view.
        return None
    for kind in _stage_order(view, config, counter):
        if kind in exhausted:
            continue
        if kind == "hard_truncate":
            # Cutting block text loses what the model passes kept; it is owed only to a view
            # the window could not serve (over the budget), not to reaching the target.
            if view.blocks and (ceiling is None or served > ceiling):
                return Stage(
                    kind=kind,
                    based_on_version=view.version,
                    target_tokens=config.target_tokens,
                    block_ids=[b.block_id for b in view.blocks],
                )
            continue
        targets = build_targets(kind, view, config, counter)
        if kind == "l0_to_l1" and sum(t.source_tokens for t in targets) < MIN_L1_SOURCE_TOKENS:
            continue
        if targets:
            raw_ids = [m.context_message_id for t in targets for m in t.raw if m.context_message_id]
            return Stage(
                kind=kind,
                based_on_version=view.version,
                target_tokens=config.target_tokens,
                first_id=min(raw_ids) if raw_ids else None,
                last_id=max(raw_ids) if raw_ids else None,
                block_ids=[b.block_id for t in targets for b in t.blocks],
            )
    return None


def _stage_order(view: View, config: PipelineConfig, counter: TokenCounter) -> tuple[StageKind, ...]:
    """``STAGE_ORDER``, but merges first while the blocks are over their share of the target
    (folding old summaries together then makes the room, rather than summarising the newest
    steps of the tail) or when L0->L1 alone would fall short of the target (the merge then
    takes in the steps L0->L1 would summarise: one model call instead of two)."""
    if not blocks_over_cap(view, config, counter) and not l1_falls_short(view, config, counter):
        return STAGE_ORDER
    return ("recursive_merge", *(k for k in STAGE_ORDER if k != "recursive_merge"))
