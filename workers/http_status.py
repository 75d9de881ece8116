"""The compaction status as the HTTP API publishes it (``compaction`` and ``compaction_detail``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ctxcore.status import CompactionDetail

__all__ = ["CompactionDetailOut", "CompactionStatusOut", "LastErrorOut", "detail_out"]

CompactionStatusOut = Literal["idle", "queued", "running", "failing"]


class LastErrorOut(BaseModel):
    """The failure that ended the conversation's last compaction job."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(
        description="The model error kind (rate_limit, timeout, authentication, ...), "
        "store_unavailable, or internal for an unclassified exception"
    )
    message: str = Field(description="The cause; for internal, the exception's class and text")
    stage: str | None = Field(description="The stage kind that failed (null: planning failed)")
    at: datetime = Field(description="When it failed (UTC)")


class CompactionDetailOut(BaseModel):
    """Why ``compaction`` says ``failing``: set until a later job succeeds."""

    model_config = ConfigDict(extra="forbid")

    last_error: LastErrorOut | None
    last_success_at: datetime | None = Field(description="When a job last ended without a failed stage (UTC)")


def detail_out(detail: CompactionDetail) -> CompactionDetailOut:
    """The response model of a ``CompactionDetail``."""
    error = detail.last_error
    return CompactionDetailOut(
        last_error=LastErrorOut(kind=error.kind, message=error.message, stage=error.stage, at=error.at)
        if error
        else None,
        last_success_at=detail.last_success_at,
    )
