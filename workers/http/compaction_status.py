"""The compaction state and status as the HTTP API publishes them (``compaction``,
``compaction_detail``, state snapshots).

The response models live in ``ctxcore.client.models`` (the client parses them too).
"""

from __future__ import annotations

from ctxcore.client.models import (
    BlockOut,
    CompactionDetailOut,
    CompactionStatusOut,
    HoldOut,
    LastErrorOut,
    StateSnapshot,
)
from ctxcore.messages import message_text
from ctxcore.state import CompressionState, SummaryBlock
from ctxcore.status import CompactionDetail

__all__ = ["CompactionDetailOut", "CompactionStatusOut", "LastErrorOut", "detail_out", "snapshot_out"]


def detail_out(detail: CompactionDetail) -> CompactionDetailOut:
    """The response model of a ``CompactionDetail``."""
    error = detail.last_error
    return CompactionDetailOut(
        last_error=LastErrorOut(kind=error.kind, message=error.message, stage=error.stage, at=error.at)
        if error
        else None,
        last_success_at=detail.last_success_at,
        reason=detail.reason,
        hold=HoldOut(**detail.hold.as_dict()) if detail.hold else None,
    )


def _block(block: SummaryBlock) -> BlockOut:
    return BlockOut(
        block_id=block.block_id,
        first_id=block.first_id,
        last_id=block.last_id,
        level=block.level,
        tokens_before=block.tokens_before,
        tokens_after=block.tokens_after,
        model=block.model,
        created_at=block.created_at,
        text="\n\n".join(message_text(m) for m in block.messages),
    )


def snapshot_out(state: CompressionState) -> StateSnapshot:
    """The response model of one state version (blocks with their text and provenance)."""
    return StateSnapshot(
        version=state.version,
        covered_until=state.covered_until,
        pinned=list(state.pinned),
        blocks=[_block(b) for b in state.blocks],
    )
