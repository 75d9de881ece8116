"""Compaction state: summary blocks with provenance, and the versioned state that orders them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ctxcore.messages import Message

__all__ = ["CompressionState", "SummaryBlock"]


def _now() -> datetime:
    return datetime.now(UTC)


class SummaryBlock(BaseModel):
    """A summary standing for a contiguous range of log messages.

    ``first_id``/``last_id`` are the log ids of the first and last message it covers, so
    everything it replaced can be read back from the log. ``level`` is 1 for a block
    made from raw steps; merging blocks raises it.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    block_id: str
    messages: list[Message]
    first_id: str
    last_id: str
    level: int = 1
    tokens_before: int = 0
    tokens_after: int = 0
    model: str = ""
    created_at: datetime = Field(default_factory=_now)


class CompressionState(BaseModel):
    """The versioned compaction state of one conversation.

    Invariant (kept by the Coordinator): every log message up to ``covered_until`` lies in
    exactly one block's range or is listed in ``pinned`` (anchors stay verbatim).
    ``version`` 0 means nothing was ever saved.
    """

    # Unknown fields written by a newer version are tolerated on load.
    model_config = ConfigDict(extra="ignore")

    version: int = 0
    blocks: list[SummaryBlock] = Field(default_factory=list)
    covered_until: str | None = None
    pinned: list[str] = Field(default_factory=list)
    # The recall index version saved with this state (0: nothing archived); the fast path
    # reloads its cached index only when a state names a newer one.
    archive_version: int = 0
    meta: dict[str, Any] = Field(default_factory=dict)
