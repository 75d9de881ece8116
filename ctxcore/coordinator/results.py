"""What a ``Coordinator`` call hands back (``CoordinatorResult``) and what a trigger sees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ctxcore.errors import ErrorKind, ModelError
from ctxcore.messages import AnyMessage
from ctxcore.pipeline import Stage, View
from ctxcore.state import CompressionState

__all__ = ["INVALID_SUMMARY", "CoordinatorResult", "Outcome", "TriggerInput", "failed_result"]

Outcome = Literal["compressed", "skipped", "failed", "conflict", "rejected"]
INVALID_SUMMARY = ErrorKind.INVALID_SUMMARY
"""``error_kind`` of a ``rejected`` result: the stage's output would break the chat protocol."""


@dataclass(frozen=True)
class TriggerInput:
    """What a trigger sees when deciding whether ``compress`` should summarise now."""

    pending_messages: Sequence[AnyMessage]
    blocks: Sequence[object]
    estimated_pending_tokens: int
    pending_turn_count: int
    state: CompressionState
    window_tokens: int = 0
    budget_tokens: int = 0


@dataclass
class CoordinatorResult:
    """The view and state after a call, what happened, and the error if it failed.

    ``exception`` is the classified ``ModelError`` of a ``failed`` call (``error`` is its
    text, ``error_kind`` its kind).
    """

    view: View
    state: CompressionState
    outcome: Outcome
    error: str | None = None
    error_kind: str | None = None
    retry_after: float | None = None
    stage: Stage | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    detail: str = ""
    extra: dict[str, object] = field(default_factory=dict)
    exception: ModelError | None = None


def failed_result(
    view: View, state: CompressionState, stage: Stage, exc: ModelError, tokens: int
) -> CoordinatorResult:
    """The ``failed`` result of a stage whose model call raised ``exc`` (state untouched)."""
    return CoordinatorResult(
        view,
        state,
        "failed",
        error=str(exc),
        error_kind=exc.kind,
        retry_after=exc.retry_after,
        stage=stage,
        tokens_before=tokens,
        tokens_after=tokens,
        exception=exc,
    )
