"""What processors report: ``ContextEvent`` per change, compression-state events per run.

A ``ContextEvent`` is a processor's own account of one change (``None`` from a hook means
"nothing changed"). A ``CompressionStateEvent`` is the engine's account of one processor
run (started / completed / noop / skipped / failed) with before/after sizes, sent to
subscribers and kept in a bounded history (spec 3.6).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ctxcore.window import ContextStats

__all__ = [
    "HISTORY_LIMIT",
    "CompressionStateEvent",
    "ContextEvent",
    "IdRange",
    "Phase",
    "ProcessorFailure",
    "Sizes",
    "StateReporter",
    "Status",
    "Subscriber",
    "format_count",
]

logger = logging.getLogger(__name__)

HISTORY_LIMIT = 100
STATE_EVENT_TYPE = "context.compression_state"

Status = Literal["started", "completed", "noop", "skipped", "failed"]
Phase = Literal["add_messages", "get_context_window", "active_compress"]


@dataclass(frozen=True)
class IdRange:
    """An inclusive span of log ids (``first <= id <= last``) taken out of a view."""

    first: str
    last: str


@dataclass(frozen=True)
class ContextEvent:
    """One change a processor made.

    Attributes:
        event_type: the processor type that made it.
        messages_to_modify: indices (in the list the processor was given) it rewrote or removed.
        compact_summary: a summary text, when the processor wrote one.
        compression_usage: model usage of the change (LLM processors only).
        removed_ranges: log-id spans whose content left the view without an offload handle;
            ``ModelContext.get_raw_messages`` still holds them.
        offload_handles: handles under which originals were stored (reload them with
            ``ModelContext.reload``).
    """

    event_type: str
    messages_to_modify: list[int] = field(default_factory=list)
    compact_summary: str = ""
    compression_usage: dict[str, Any] | None = None
    removed_ranges: list[IdRange] = field(default_factory=list)
    offload_handles: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sizes:
    """The view's size at one moment: messages, tokens, share of the context window, and
    when it was measured (ISO-8601 UTC with milliseconds, spec 3.6)."""

    messages: int
    tokens: int
    context_percent: int
    time: str = ""


@dataclass(frozen=True)
class ProcessorFailure:
    """A processor that raised during an operation; the operation went on without it."""

    processor: str
    phase: Phase
    error: BaseException


@dataclass(frozen=True)
class CompressionStateEvent:
    """The engine's report on one processor run (type ``context.compression_state``).

    ``model`` is the compressor's summarisation model ("" for rule processors) and
    ``statistic`` the ``ContextStats`` of ``after``, else of ``before`` (spec 3.6).
    """

    operation_id: str
    status: Status
    phase: Phase
    processor: str
    trigger: str
    context_max: int
    summary: str
    before: Sizes | None = None
    after: Sizes | None = None
    model: str = ""
    statistic: ContextStats | None = None
    saved_messages: int = 0
    saved_tokens: int = 0
    saved_percent: float = 0.0
    duration_ms: float = 0.0
    compact_summary: str = ""
    compression_usage: dict[str, Any] | None = None
    event: ContextEvent | None = None
    reason: str = ""
    error: str = ""
    type: str = STATE_EVENT_TYPE

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event."""
        return asdict(self)


def format_count(n: int) -> str:
    """``999`` -> ``"999"``, ``1234`` -> ``"1.2k"``, ``2_500_000`` -> ``"2.5m"``."""
    if abs(n) >= 1_000_000:
        return f"{n / 1_000_000:.1f}m"
    if abs(n) >= 1000:
        return f"{n / 1000:.1f}k"
    return str(n)


def percent_of(tokens: int, context_max: int) -> int:
    """Share of the window in whole percent, clamped to 0..100."""
    return max(0, min(100, round(tokens / context_max * 100))) if context_max > 0 else 0


def summarise(
    status: Status,
    before: Sizes | None,
    after: Sizes | None,
    *,
    reason: str = "",
    modified: int = 0,
) -> str:
    """The one-line human summary of a state event (spec 3.6 wording, paraphrased)."""
    if status == "started" and before is not None:
        return f"Compressing {before.messages} messages, ~{format_count(before.tokens)} tokens"
    if status == "failed":
        tokens = format_count(before.tokens) if before else "?"
        return f"Context processor failed; context remains ~{tokens} tokens"
    if status == "skipped":
        return f"Context processor skipped: {reason}"
    if status == "noop" and before is not None:
        return f"Context unchanged at ~{format_count(before.tokens)} tokens (saved 0.0%)"
    if status == "completed" and before is not None and after is not None:
        saved = before.tokens - after.tokens
        pct = saved / before.tokens * 100 if before.tokens else 0.0
        text = (
            f"Compressed {before.messages} -> {after.messages} messages, ~{format_count(before.tokens)} -> "
            f"~{format_count(after.tokens)} tokens, saved ~{format_count(saved)} tokens ({pct:.1f}%)"
        )
        return text + (f", modified {modified} messages" if modified else "")
    return status


Subscriber = Callable[[CompressionStateEvent], None]


class StateReporter:
    """Delivers state events to subscribers and keeps the last ``HISTORY_LIMIT`` of them.

    A failing subscriber is logged and skipped: reporting never breaks a context operation.
    """

    def __init__(self, shared: list[Subscriber] | None = None) -> None:
        self.subscribers: list[Subscriber] = []
        # The engine's list: engine-level subscriptions reach every context it created.
        self._shared = shared if shared is not None else []
        self.history: deque[CompressionStateEvent] = deque(maxlen=HISTORY_LIMIT)

    def emit(self, event: CompressionStateEvent) -> None:
        """Record ``event`` and hand it to every subscriber."""
        self.history.append(event)
        for callback in [*self._shared, *self.subscribers]:
            try:
                callback(event)
            except Exception:
                logger.warning("compression-state subscriber %r failed", callback, exc_info=True)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns a function that removes it again."""
        self.subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self.subscribers:
                self.subscribers.remove(callback)

        return unsubscribe
