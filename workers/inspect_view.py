"""``ctxcore inspect``'s overview for people: one screen (about 40 lines for 10 blocks).

Status and why first, then the versions, the blocks as a table (log-id ranges and tokens),
the newest journal entries and the last error. Built from the same reads as ``--json``
(which keeps the whole state); a pure function of them, so it is tested without a store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ctxcore.state import CompressionState, ConversationKey
from ctxcore.state.journal import JournalEntry
from ctxcore.status import CompactionDetail
from workers.table_cells import cell

__all__ = ["MAX_BLOCK_ROWS", "MAX_JOURNAL_ROWS", "InspectView", "render_overview"]

MAX_BLOCK_ROWS = 12
MAX_JOURNAL_ROWS = 8
_WIDTH = 100  # a line's most characters: free text is cut with an ellipsis (--json has it whole)


@dataclass(frozen=True)
class InspectView:
    """What the overview shows of one conversation."""

    key: ConversationKey
    status: str
    detail: CompactionDetail
    state: CompressionState | None
    kept_versions: Sequence[int]
    journal: Sequence[JournalEntry]
    last_log_id: str | None
    budget: int | None


def _time(at: datetime, year: bool = False) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S" if year else "%m-%d %H:%M:%S")


def _tokens(before: int | None, after: int | None) -> str:
    if before is None:
        return "-"
    return f"{before:,}->{after:,}" if after is not None else f"{before:,}"


def _cut(text: str) -> str:
    return cell(text, _WIDTH).rstrip()


def _head(view: InspectView) -> list[str]:
    detail = view.detail
    reason = f" ({detail.reason})" if detail.hold is not None else ""
    if detail.last_error is not None and not reason:
        reason = (
            f" (the last job failed: {detail.last_error.kind} at {detail.last_error.stage or 'planning'})"
        )
    lines = [_cut(f"{view.key}  compaction: {view.status}{reason}")]
    if detail.hold is not None:
        lines.append(_cut(f"  why: {detail.hold.why}"))
    log = f"log ends at {view.last_log_id}" if view.last_log_id else "log empty"
    budget = f"budget {view.budget:,}" if view.budget is not None else "no budget recorded"
    lines.append(f"{log} · {budget}")
    state = view.state
    if state is None:
        lines.append("no compaction state saved yet")
    else:
        kept = view.kept_versions
        shown = f"kept {min(kept)}..{max(kept)}" if kept else "none kept"
        covered = state.covered_until or "nothing"
        lines.append(
            f"state version {state.version} ({shown}) · covers up to {covered} · {len(state.pinned)} pinned"
        )
    if detail.last_success_at is not None:
        lines.append(f"last success {_time(detail.last_success_at, year=True)}")
    return lines


def _blocks(state: CompressionState | None) -> list[str]:
    blocks = list(state.blocks) if state is not None else []
    if not blocks:
        return []
    lines = [
        "",
        f"blocks ({len(blocks)}):",
        "  lvl  range                           before->after  model                 created",
    ]
    shown = blocks if len(blocks) <= MAX_BLOCK_ROWS else blocks[-(MAX_BLOCK_ROWS - 1) :]
    if len(shown) < len(blocks):
        lines.append(f"  ... {len(blocks) - len(shown)} older blocks (--json lists every block)")
    for b in shown:
        tokens = _tokens(b.tokens_before, b.tokens_after)
        lines.append(
            f"  L{b.level:<3} {b.first_id}..{b.last_id}  {tokens:>16}  {cell(b.model or '-', 20)}  {_time(b.created_at)}"
        )
    return lines


def _journal(entries: Sequence[JournalEntry]) -> list[str]:
    if not entries:
        return ["", "journal: no stage has run yet"]
    shown = entries[:MAX_JOURNAL_ROWS]
    lines = [
        "",
        f"journal (newest {len(shown)} of {len(entries)}):",
        "  at              stage           outcome      before->after  calls      ms  saved  note",
    ]
    for e in shown:
        saved = f"v{e.version}" if e.version is not None else "-"
        note = e.error_kind or e.detail
        line = (
            f"  {_time(e.at)}  {cell(e.stage, 14)}  {cell(e.outcome, 11)}  {_tokens(e.tokens_before, e.tokens_after):>13}"
            f"  {e.model_calls:>5}  {e.duration_ms:>6.0f}  {saved:<5}  {note}"
        )
        lines.append(_cut(line))
    return lines


def render_overview(view: InspectView) -> list[str]:
    """The overview's lines (see the module docstring)."""
    lines = [*_head(view), *_blocks(view.state), *_journal(view.journal)]
    error = view.detail.last_error
    if error is not None:
        where = f"{_time(error.at, year=True)}, {error.stage or 'planning'}"
        lines += ["", _cut(f"last error ({where}): {error.kind}: {error.message}")]
    lines += ["", "--json: the whole state; --history: with the kept versions"]
    return lines
