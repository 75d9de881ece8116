"""The HTTP API's request and response bodies (pydantic only): the app serves them, the client parses them.

They are also the published OpenAPI schemas (``workers.http`` imports them). Request models
reject unknown keys; response models ignore them, so an older client keeps working against
a newer server that adds fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema

from ctxcore.client.bodies import RequestBody, ResponseBody
from ctxcore.client.history_models import JournalEntryOut, JournalResponse, RollbackRequest, RollbackResponse
from ctxcore.client.recall_models import RecallHit, RecallRequest, RecallResponse
from ctxcore.messages import from_openai, to_openai

__all__ = [
    "AppendRequest",
    "AppendResponse",
    "BlockOut",
    "CompactResponse",
    "CompactionDetailOut",
    "CompactionStatusOut",
    "ConversationList",
    "ElidedRange",
    "ErrorBody",
    "HealthResponse",
    "HoldOut",
    "JournalEntryOut",
    "JournalResponse",
    "LastErrorOut",
    "MessageIn",
    "MessageOut",
    "MessagesPage",
    "OffloadResponse",
    "RecallHit",
    "RecallRequest",
    "RecallResponse",
    "RollbackRequest",
    "RollbackResponse",
    "StateResponse",
    "StateSnapshot",
    "TruncateResponse",
    "UndecodableEntry",
    "UsageResponse",
    "WindowFormat",
    "WindowRequest",
    "WindowResponse",
    "WindowStats",
]

# Messages are validated by ``ctxcore.messages.from_openai`` (which names the index and field
# of the first problem), not by pydantic: the schema below documents them for OpenAPI only.
_MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "ChatMessage",
    "description": "An OpenAI chat-format message. ctxcore extension keys: message_id "
    "(deduplicates appends), metadata, context_message_id (the log id, in responses). Other "
    "keys are kept and returned.",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
                {"type": "null"},
            ]
        },
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "message_id": {"type": "string"},
        "context_message_id": {"type": "string"},
        "metadata": {"type": "object"},
    },
    "additionalProperties": True,
}
MessageIn = Annotated[Any, WithJsonSchema(_MESSAGE_SCHEMA)]
MessageOut = Annotated[dict[str, Any], WithJsonSchema(_MESSAGE_SCHEMA)]

COMPACTION_STATUSES: tuple[str, ...] = ("idle", "queued", "running", "failing", "paused")


def _known_status(value: object) -> object:
    # A newer server may add a status: a client reads it as "unknown", never as an error.
    return value if value in COMPACTION_STATUSES or not isinstance(value, str) else "unknown"


CompactionStatusOut = Annotated[
    Literal["idle", "queued", "running", "failing", "paused", "unknown"],
    BeforeValidator(_known_status),
    WithJsonSchema(
        {
            "type": "string",
            "enum": list(COMPACTION_STATUSES),
            "description": (
                "idle, queued, running; failing while the last job failed; paused while no job "
                "starts (compaction_detail.reason: no_progress or budget_exhausted). Clients read a "
                "status they do not know as unknown."
            ),
        }
    ),
]
WindowFormat = Literal["ctxcore", "openai"]


class AppendRequest(RequestBody):
    """Messages to append, in OpenAI chat format (system messages are rejected)."""

    messages: list[MessageIn] = Field(min_length=1)


class AppendResponse(ResponseBody):
    """The log ids of the messages (existing ids for duplicates) and the id to send as If-Match."""

    ids: list[str]
    last_id: str | None


class WindowRequest(RequestBody):
    """What the model will be called with besides the conversation."""

    # Its range is checked once, where every window starts (``ContextService.get_window``).
    budget_tokens: int | None = Field(
        default=None,
        description=(
            "Token budget of the whole request (system + tools + messages), 1 to 1,000,000,000;"
            " default: the tenant's default_budget, else service.default_budget"
        ),
    )
    model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:/-]{1,128}$",
        description="Model name choosing the tokenizer (default: the configured one)",
    )
    system_messages: list[MessageIn] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)


class WindowStats(ResponseBody):
    """Message and token counts of the served window."""

    total_messages: int
    total_tokens: int
    total_dialogues: int
    system_messages: int
    user_messages: int
    assistant_messages: int
    tool_messages: int
    tools: int
    system_message_tokens: int
    user_message_tokens: int
    assistant_message_tokens: int
    tool_message_tokens: int
    tool_tokens: int


class ElidedRange(ResponseBody):
    """Log ids of tail messages the fast-path fallback left out of this window."""

    first_id: str
    last_id: str


class LastErrorOut(ResponseBody):
    """The failure that ended the conversation's last compaction job."""

    kind: str = Field(
        description="The model error kind (rate_limit, timeout, authentication, ...), "
        "store_unavailable, or internal for an unclassified exception"
    )
    message: str = Field(description="The cause; for internal, the exception's class and text")
    stage: str | None = Field(description="The stage kind that failed (null: planning failed)")
    at: datetime = Field(description="When it failed (UTC)")


class HoldOut(ResponseBody):
    """Why no compaction job starts, and the sizes (tokens) that say so."""

    reason: str = Field(description="no_progress, budget_exhausted (status paused) or newest_step (idle)")
    at: datetime = Field(description="When the hold was recorded (UTC)")
    why: str = Field(description="What could not be summarised and why, in words")
    view_tokens: int = Field(default=0, description="The view as served when the hold was recorded")
    target_tokens: int = Field(default=0, description="The compaction target")
    budget_tokens: int = Field(
        default=0,
        description="The conversation's budget: the window's budget less its system messages and tools",
    )
    held_tokens: int = Field(
        default=0, description="What no stage summarises: the anchors and the newest step"
    )
    last_id: str | None = Field(default=None, description="The log's last id when the hold was recorded")
    used_tokens: int | None = Field(default=None, description="budget_exhausted: tokens used on that UTC day")
    cap_tokens: int | None = Field(default=None, description="budget_exhausted: the tenant's daily cap")
    needed_tokens: int | None = Field(default=None, description="budget_exhausted: what the stage asked for")
    day: str | None = Field(default=None, description="budget_exhausted: the UTC day (YYYY-MM-DD)")


class CompactionDetailOut(ResponseBody):
    """Why ``compaction`` says ``failing`` (set until a later job succeeds) or ``paused``."""

    last_error: LastErrorOut | None
    last_success_at: datetime | None = Field(
        description="When a compaction job last saved a state version and ended without a failed stage (UTC)"
    )
    reason: str | None = Field(
        default=None,
        description="Why no job starts: no_progress, budget_exhausted (paused) or newest_step (idle); null: none",
    )
    hold: HoldOut | None = Field(default=None, description="The hold's sizes (null: jobs may start)")


class WindowResponse(ResponseBody):
    """The window to send to the model and how it was made.

    ``messages`` come system messages first; with ``format=openai`` they carry OpenAI keys
    only, otherwise also ``context_message_id``, ``message_id`` and ``metadata``.
    ``tools`` are exactly the tools the budget counted: send them with the messages.
    """

    messages: list[MessageOut]
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="The tools the budget counted: the request's, then ctxcore's own"
    )
    stats: WindowStats
    state_version: int
    compaction: CompactionStatusOut
    compaction_detail: CompactionDetailOut
    fallback_applied: bool
    elided_ranges: list[ElidedRange] = Field(default_factory=list)

    def openai_messages(self) -> list[dict[str, Any]]:
        """The messages exactly as the OpenAI SDK accepts them (ctxcore's keys removed)."""
        return to_openai(from_openai(self.messages), include_extra=False)


class CompactResponse(ResponseBody):
    """The conversation's compaction status after the request."""

    status: CompactionStatusOut


class BlockOut(ResponseBody):
    """A summary block and its provenance (the log-id range it stands for)."""

    block_id: str
    first_id: str
    last_id: str
    level: int
    tokens_before: int
    tokens_after: int
    model: str
    created_at: datetime
    text: str


class StateSnapshot(ResponseBody):
    """One version of a conversation's compaction state."""

    version: int
    covered_until: str | None
    pinned: list[str]
    blocks: list[BlockOut]


class StateResponse(StateSnapshot):
    """The current compaction state, the conversation's budget and (``?history=1``) kept versions."""

    budget: int | None = Field(
        description="The conversation's budget as the last window recorded it: that window's budget less "
        "its system messages and tools (the room workers compact to); null before any window"
    )
    compaction: CompactionStatusOut | None = Field(
        default=None,
        description="The status as of the last job (a window may re-arm a paused conversation earlier)",
    )
    compaction_detail: CompactionDetailOut
    history: list[StateSnapshot] | None = Field(
        default=None, description="Kept versions, newest first (only with ?history=1)"
    )


class OffloadResponse(ResponseBody):
    """Original messages kept behind an offload handle."""

    handle: str
    messages: list[MessageOut]


class UndecodableEntry(ResponseBody):
    """A log entry that no longer decodes as a message (written by an older version, or
    damaged in the store): left out of ``messages`` and of every window."""

    id: str = Field(description="Its log id")
    detail: str = Field(description="Why it does not decode")


class MessagesPage(ResponseBody):
    """A page of the raw log, oldest first, each with its ``context_message_id``; pass
    ``next`` as ``after`` for the following page (null: this was the last). Entries of the
    page that no longer decode are listed in ``undecodable`` instead."""

    messages: list[MessageOut]
    next: str | None
    undecodable: list[UndecodableEntry] = Field(default_factory=list)


class TruncateResponse(ResponseBody):
    """The log ids removed by ``DELETE .../messages?after=`` and where the log now ends."""

    removed: list[str]
    last_id: str | None


class ConversationList(ResponseBody):
    """A page of conversation ids; pass ``next`` as ``after`` for the following page."""

    conversations: list[str]
    next: str | None


class UsageResponse(ResponseBody):
    """Summariser calls and tokens spent on the tenant's conversations."""

    tenant: str
    calls: int
    input_tokens: int
    output_tokens: int
    day: str | None = Field(default=None, description="The UTC day of summariser_tokens_today (YYYY-MM-DD)")
    summariser_tokens_today: int = Field(
        default=0, description="Summariser tokens (input + output) counted today, reservations included"
    )
    summariser_tokens_per_day: int | None = Field(
        default=None, description="The tenant's daily cap (null: none; 0: rules only, no summariser call)"
    )


class HealthResponse(ResponseBody):
    """``ok`` when Redis answers."""

    status: Literal["ok", "unavailable"]


class ErrorBody(BaseModel):
    """Every error: a code and a human-readable detail, plus fields specific to the code."""

    error: str = Field(description="Machine-readable code, e.g. not_found, invalid_message, rate_limited")
    detail: str | list[dict[str, Any]]
    index: int | None = Field(default=None, description="invalid_message: index of the bad message")
    field: str | None = Field(default=None, description="invalid_message: the offending field")
    location: str | None = Field(default=None, description="invalid_message: messages or system_messages")
    budget: int | None = Field(default=None, description="budget_exceeded: the budget asked for")
    system_tokens: int | None = None
    tools_tokens: int | None = None
    anchor_tokens: int | None = None
    last_id: str | None = Field(
        default=None, description="conflict, truncate_refused: the log's actual last id"
    )
    reason: str | None = Field(
        default=None, description="truncate_refused: covered, busy or moved (nothing was removed)"
    )
    setting: str | None = Field(default=None, description="recall_disabled: the setting to turn on")
    state_version: int | None = Field(default=None, description="invalid_window: the state served")
    violations: list[dict[str, Any]] | None = Field(
        default=None, description="invalid_window: the protocol violations (index, rule, detail)"
    )
