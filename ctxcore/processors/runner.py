"""Running one processor hook with failure isolation and state reporting (spec 3.3, 3.6).

``ProcessorRun`` wraps a single hook call: it emits ``started``, calls the hook, and
emits ``completed`` / ``noop`` with before/after sizes, or ``failed`` with the error. An
``Exception`` is recorded and swallowed so the operation goes on with the input unchanged;
a cancellation (``KeyboardInterrupt``, ``asyncio.CancelledError``) is reported and re-raised.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from ctxcore.messages import AnyMessage
from ctxcore.processors.events import (
    CompressionStateEvent,
    ContextEvent,
    Phase,
    ProcessorFailure,
    Sizes,
    StateReporter,
    Status,
    percent_of,
    summarise,
)
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector
from ctxcore.window import ContextStats, compute_stats

__all__ = ["OperationReporter"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
CANCELLATION = (KeyboardInterrupt, asyncio.CancelledError)


def _now() -> str:
    """ISO-8601 UTC time with milliseconds, as state events carry it."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class OperationReporter:
    """Runs hooks of one context and reports on them; collects the failures of an operation."""

    def __init__(
        self,
        reporter: StateReporter,
        counter: TokenCounter,
        context_max: int,
        label: str,
        detector: UserDetector | None = None,
    ) -> None:
        self.reporter = reporter
        self.counter = counter
        self.detector = detector
        self.context_max = context_max
        self.failures: list[ProcessorFailure] = []
        self._ids = itertools.count(1)
        self._label = label

    def sizes(self, messages: Sequence[AnyMessage]) -> Sizes:
        """Messages, tokens and window share of ``messages``, measured now."""
        return self.measure(messages)[0]

    def measure(self, messages: Sequence[AnyMessage]) -> tuple[Sizes, ContextStats]:
        """``sizes`` and the full statistics of ``messages`` (one count)."""
        stats = compute_stats([], messages, [], self.counter, self.detector)
        tokens = stats.total_tokens
        return Sizes(len(messages), tokens, percent_of(tokens, self.context_max), _now()), stats

    def emit(
        self,
        status: Status,
        phase: Phase,
        processor: str,
        trigger: str,
        *,
        operation_id: str | None = None,
        before: Sizes | None = None,
        after: Sizes | None = None,
        event: ContextEvent | None = None,
        reason: str = "",
        error: str = "",
        duration_ms: float = 0.0,
        model: str = "",
        statistic: ContextStats | None = None,
    ) -> None:
        """Build and deliver one state event."""
        saved_tokens = before.tokens - after.tokens if before and after else 0
        self.reporter.emit(
            CompressionStateEvent(
                operation_id=operation_id or self.next_operation_id(),
                status=status,
                phase=phase,
                processor=processor,
                trigger=trigger,
                context_max=self.context_max,
                summary=summarise(
                    status,
                    before,
                    after,
                    reason=reason,
                    modified=len(event.messages_to_modify) if event else 0,
                ),
                before=before,
                after=after,
                model=model,
                statistic=statistic,
                saved_messages=before.messages - after.messages if before and after else 0,
                saved_tokens=saved_tokens,
                saved_percent=round(saved_tokens / before.tokens * 100, 1)
                if before and before.tokens
                else 0.0,
                duration_ms=duration_ms,
                compact_summary=event.compact_summary if event else "",
                compression_usage=event.compression_usage if event else None,
                event=event,
                reason=reason,
                error=error,
            )
        )

    def next_operation_id(self) -> str:
        """A new operation id, unique within the context."""
        return f"{self._label}-{next(self._ids)}"

    def run(
        self,
        processor: str,
        phase: Phase,
        trigger: str,
        before: Sequence[AnyMessage],
        hook: Callable[[], tuple[ContextEvent | None, T]],
        after: Callable[[T], Sequence[AnyMessage]],
        *,
        model: str = "",
    ) -> tuple[ContextEvent | None, T] | None:
        """Call ``hook`` with reporting; returns its (event, output), or None if it failed.

        ``before`` is what the processor starts from; ``after`` maps the hook's output to
        the messages it leaves, for the size report; ``model`` names the processor's model.
        """
        operation_id = self.next_operation_id()
        before_sizes, before_stats = self.measure(before)
        self.emit(
            "started",
            phase,
            processor,
            trigger,
            operation_id=operation_id,
            model=model,
            before=before_sizes,
            statistic=before_stats,
        )
        started = time.perf_counter()
        try:
            event, output = hook()
        except CANCELLATION:
            self.emit(
                "failed",
                phase,
                processor,
                trigger,
                before=before_sizes,
                statistic=before_stats,
                reason="processor_cancelled",
                error="cancelled",
                operation_id=operation_id,
                model=model,
            )
            raise
        except Exception as exc:
            logger.warning(
                "processor %s failed during %s; continuing without it", processor, phase, exc_info=True
            )
            self.failures.append(ProcessorFailure(processor, phase, exc))
            self.emit(
                "failed",
                phase,
                processor,
                trigger,
                before=before_sizes,
                statistic=before_stats,
                reason="processor_error",
                error=f"{type(exc).__name__}: {exc}",
                operation_id=operation_id,
                model=model,
            )
            return None
        duration = (time.perf_counter() - started) * 1000
        if event is not None:
            after_sizes, after_stats = self.measure(after(output))
        else:
            after_sizes, after_stats = replace(before_sizes, time=_now()), before_stats
        self.emit(
            "completed" if event is not None else "noop",
            phase,
            processor,
            trigger,
            before=before_sizes,
            after=after_sizes,
            statistic=after_stats,
            event=event,
            duration_ms=duration,
            operation_id=operation_id,
            model=model,
        )
        return event, output
