"""The tracer seam: what ctxcore and its workers need of a tracer, as two Protocols.

ctxcore never imports OpenTelemetry. The workers pass a ``Tracer`` where they open spans
(``workers.telemetry`` builds an OpenTelemetry one when ``telemetry`` is on, else
``NO_TRACER``); deep code that has something to say about the span it runs in (the rule
chain naming the rules that changed a window) writes to ``current_span()``, which is
``NO_SPAN`` unless a tracer opened one in this context.

Contexts cross processes as W3C ``traceparent`` strings
(``00-<trace id>-<span id>-<flags>``): stored beside a queued job, carried in a stage
task's headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from typing import Protocol

__all__ = [
    "NO_SPAN",
    "NO_TRACER",
    "AttributeValue",
    "NoTracer",
    "Span",
    "Tracer",
    "activate_span",
    "current_span",
    "restore_span",
]

AttributeValue = str | bool | int | float | Sequence[str]


class Span(Protocol):
    """One operation being traced."""

    def set(self, name: str, value: AttributeValue) -> None:
        """Set attribute ``name`` (OpenTelemetry naming: ``gen_ai.usage.input_tokens``)."""

    def count(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to the integer attribute ``name`` (0 before the first count)."""

    def append(self, name: str, item: str) -> None:
        """Add ``item`` to the string-list attribute ``name`` (once: a set in insertion order)."""

    def fail(self, error: BaseException) -> None:
        """Mark the span failed with ``error`` (its class and message are recorded)."""


class Tracer(Protocol):
    """Opens spans; says which context is current; continues a context from elsewhere."""

    @property
    def enabled(self) -> bool:
        """False for ``NO_TRACER``: callers may skip work that only feeds spans."""

    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        parent: str | None = None,
        links: Sequence[str] = (),
        root: bool = False,
    ) -> AbstractContextManager[Span]:
        """A span of ``name``, current while the block runs and ended when it leaves.

        Args:
            name: the span's name.
            attributes: set when the span starts.
            parent: a ``traceparent`` to continue instead of the current context.
            links: ``traceparent`` s the span links to (an unparsable one is skipped).
            root: start a new trace, whatever is current.

        An exception leaving the block marks the span failed and propagates.
        """

    def traceparent(self) -> str | None:
        """The current context as a ``traceparent`` (None: no sampled span is current)."""

    def attached(self, traceparent: str | None) -> AbstractContextManager[None]:
        """Make ``traceparent`` the current context while the block runs (None: no change)."""


class _NoSpan:
    """A span that records nothing."""

    def set(self, name: str, value: AttributeValue) -> None:
        """Nothing."""

    def count(self, name: str, amount: int = 1) -> None:
        """Nothing."""

    def append(self, name: str, item: str) -> None:
        """Nothing."""

    def fail(self, error: BaseException) -> None:
        """Nothing."""


NO_SPAN: Span = _NoSpan()


# Reusable no-op context managers: no allocation per span when telemetry is off.
_NOTHING = nullcontext(NO_SPAN)
_NONE: AbstractContextManager[None] = nullcontext()


class NoTracer:
    """The tracer when telemetry is off: every span is ``NO_SPAN``, nothing is recorded."""

    @property
    def enabled(self) -> bool:
        """Always False."""
        return False

    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        parent: str | None = None,
        links: Sequence[str] = (),
        root: bool = False,
    ) -> AbstractContextManager[Span]:
        """``NO_SPAN``, current for nothing."""
        return _NOTHING

    def traceparent(self) -> str | None:
        """Always None."""
        return None

    def attached(self, traceparent: str | None) -> AbstractContextManager[None]:
        """Changes nothing."""
        return _NONE


NO_TRACER: Tracer = NoTracer()

# The span deep code may annotate (``current_span``): set by a tracer while its span is current.
_CURRENT: ContextVar[Span] = ContextVar("ctxcore_current_span", default=NO_SPAN)


def current_span() -> Span:
    """The span current in this context, ``NO_SPAN`` when none is."""
    return _CURRENT.get()


def activate_span(span: Span) -> Token[Span]:
    """Make ``span`` what ``current_span`` returns (a tracer's span, when it starts)."""
    return _CURRENT.set(span)


def restore_span(token: Token[Span]) -> None:
    """Undo the ``activate_span`` that returned ``token`` (when its span ends)."""
    _CURRENT.reset(token)
