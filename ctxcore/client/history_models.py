"""The bodies of a conversation's history routes: ``GET .../journal`` and ``POST .../rollback``
(re-exported by ``ctxcore.client.models``, whose conventions they follow)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["JournalEntryOut", "JournalResponse", "RollbackRequest", "RollbackResponse"]


class JournalEntryOut(BaseModel):
    """One compaction stage run (or rollback) of the conversation."""

    model_config = ConfigDict(extra="ignore")

    stage: str = Field(description="The stage kind (l0_to_l1, ..., hard_truncate), planning or rollback")
    outcome: str = Field(
        description="compressed, skipped, conflict, failed, rejected, paused, error or rolled_back"
    )
    at: datetime
    tokens_before: int | None
    tokens_after: int | None
    model_calls: int = Field(description="Summariser calls the run made")
    input_tokens: int = Field(description="Summariser input tokens")
    output_tokens: int = Field(description="Summariser output tokens")
    duration_ms: float
    error_kind: str | None
    error_message: str | None = Field(description="The error's text, secrets redacted")
    version: int | None = Field(description="The state version the run saved (null: none)")
    detail: str


class JournalResponse(BaseModel):
    """The conversation's stage journal, newest first (the newest 200 runs are kept)."""

    model_config = ConfigDict(extra="ignore")

    entries: list[JournalEntryOut]


class RollbackRequest(BaseModel):
    """The kept state version to make current again."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(gt=0, le=2**62, description="A kept version (GET .../state?history=1 lists them)")


class RollbackResponse(BaseModel):
    """The version restored and the new current version that holds it."""

    model_config = ConfigDict(extra="ignore")

    restored: int
    version: int
