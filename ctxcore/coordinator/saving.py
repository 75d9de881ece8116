"""Saving a stage's result: the rejected, conflict and compressed outcomes, and the recall
archive of what the stage folds.

A save is the last thing a stage does, so every outcome but ``compressed`` leaves the
saved state as it was.
"""

from __future__ import annotations

from ctxcore.coordinator.results import INVALID_SUMMARY, CoordinatorResult
from ctxcore.pipeline import Stage, StageResult, View
from ctxcore.pipeline.checks import rejected_view_error, view_violations
from ctxcore.recall.archive import ChunkingConfig, archive_messages, fully_archived
from ctxcore.recall.index import RecallIndex
from ctxcore.recall.marking import is_verbatim, mark_archived
from ctxcore.state import CompressionState, ConversationKey, StateStore, SummaryBlock
from ctxcore.state.archive import ArchiveWrite
from ctxcore.tokens import TokenCounter

__all__ = ["archive_folded", "save_result"]


def save_result(
    store: StateStore,
    key: ConversationKey,
    view: View,
    state: CompressionState,
    stage: Stage,
    result: StageResult,
    chunking: ChunkingConfig | None,
    counter: TokenCounter,
) -> CoordinatorResult:
    """Save a stage's result with CAS (or report why not); with ``chunking`` (recall on)
    what it folds is archived in the same save."""
    out = CoordinatorResult(
        view,
        state,
        "skipped",
        stage=stage,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_before,
        model_calls=result.model_calls,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        detail=result.detail,
    )
    if not result.changed:
        return out
    blocks, archive = archive_folded(store, key, view, result, chunking, counter)
    new_view = view.with_blocks(blocks, result.covered_until, version=state.version + 1)
    after = new_view.tokens(counter)
    if after >= result.tokens_before:
        # The archive's note on each new block can outweigh what a small re-summary saved:
        # saved, the stage would count as progress and run again on the same view (tau-bench
        # with recall at half of each run: 1,198 calls of one pass in a 45-window run).
        out.detail = (
            f"not smaller than before once marked archived ({after} >= {result.tokens_before} tokens)"
        )
        return out
    violations = view_violations(new_view)
    if violations:
        error = rejected_view_error(view, stage.kind, key, violations)
        out.outcome, out.error, out.error_kind = "rejected", str(error), INVALID_SUMMARY
        out.detail = f"{len(violations)} protocol violation(s); first: {violations[0].rule}"
        return out
    new_state = CompressionState(
        blocks=blocks,
        covered_until=result.covered_until,
        pinned=result.pinned,
        archive_version=archive.version if archive is not None else state.archive_version,
    )
    # A failed archive write fails the save (StoreError propagates): the state stays.
    if not store.save(key, new_state, expected_version=state.version, archive=archive):
        reloaded = store.load(key) or CompressionState()
        out.outcome, out.state, out.detail = "conflict", reloaded, "another writer saved first"
        return out
    saved = new_state.model_copy(update={"version": state.version + 1})
    out.view = new_view
    out.state, out.outcome, out.tokens_after = saved, "compressed", after
    return out


def archive_folded(
    store: StateStore,
    key: ConversationKey,
    view: View,
    result: StageResult,
    chunking: ChunkingConfig | None,
    counter: TokenCounter,
) -> tuple[list[SummaryBlock], ArchiveWrite | None]:
    """With recall on (``chunking``): archive what the stage folds (log messages the view
    held raw that the new state covers) and mark each new block whose range is all archived."""
    if chunking is None:
        return list(result.blocks), None
    kept = {*result.pinned}
    held = {m.context_message_id: m for m in (*view.pinned, *view.tail)}
    covered = result.covered_until or ""
    folded = [m for i, m in held.items() if i is not None and i <= covered and i not in kept]
    stored = store.load_archive(key)
    index = RecallIndex.from_bytes(stored) if stored is not None else None
    index, archive = archive_messages(index, folded, counter, chunking)
    old = {b.block_id for b in view.blocks}
    pinned = frozenset(result.pinned)
    # A verbatim block is raw messages, not a summary: nothing of it was lost to mark.
    blocks = [
        mark_archived(b)
        if b.block_id not in old
        and not is_verbatim(b)
        and fully_archived(index, b.first_id, b.last_id, pinned)
        else b
        for b in result.blocks
    ]
    return blocks, archive
