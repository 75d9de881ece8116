"""The compaction status as the HTTP API publishes it (``compaction`` and ``compaction_detail``).

The response models live in ``ctxcore.client.models`` (the client parses them too).
"""

from __future__ import annotations

from ctxcore.client.models import CompactionDetailOut, CompactionStatusOut, LastErrorOut
from ctxcore.status import CompactionDetail

__all__ = ["CompactionDetailOut", "CompactionStatusOut", "LastErrorOut", "detail_out"]


def detail_out(detail: CompactionDetail) -> CompactionDetailOut:
    """The response model of a ``CompactionDetail``."""
    error = detail.last_error
    return CompactionDetailOut(
        last_error=LastErrorOut(kind=error.kind, message=error.message, stage=error.stage, at=error.at)
        if error
        else None,
        last_success_at=detail.last_success_at,
    )
