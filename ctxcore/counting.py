"""``tolerant(counter)``: a token counter that never breaks a window because the counter raised.

The reference falls back to ``len // 4`` when a counter fails (spec 2.5); so does ctxcore,
wherever a window is counted (statistics, ``assemble_window``, the Coordinator's views).
Each failed count is estimated on its own; the first failure of a counter instance is
logged as one WARNING with its cause, later ones only at DEBUG, so a broken counter is
visible without flooding the log.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ctxcore.messages import AnyMessage
from ctxcore.tokens import EstimateCounter, TokenCounter

__all__ = ["FallbackCounter", "tolerant"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# One wrapper per counter instance, so "warn once" holds across windows. Weak keys: a
# wrapper lives as long as the counter it wraps.
_WRAPPERS: weakref.WeakKeyDictionary[Any, FallbackCounter] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
# Counters defined there never raise (the built-ins) or are tolerant already (WindowCounter).
_TOLERANT_MODULES = frozenset({"ctxcore.tokens", "ctxcore.window_counter"})


class FallbackCounter:
    """Delegates to ``inner``; a count that raises is estimated with ``len // 4`` instead."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self._estimate = EstimateCounter()
        self._warned = False
        self._lock = threading.Lock()

    def _fallback(self, what: str, exc: Exception) -> None:
        with self._lock:
            first, self._warned = not self._warned, True
        if first:
            log.warning(
                "token counter %s failed counting %s (%s: %s); using the len // 4 estimate for such counts",
                type(self.inner).__name__,
                what,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
        else:
            log.debug("token counter %s failed again counting %s: %s", type(self.inner).__name__, what, exc)

    def _count(self, what: str, exact: Callable[[], int], estimate: Callable[[], int]) -> int:
        try:
            return int(exact())
        except Exception as exc:  # any counter bug: the window is still served, estimated
            self._fallback(what, exc)
            return estimate()

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` (estimated if the counter raises)."""
        return self._count("text", lambda: self.inner.count_text(text), lambda: len(text) // 4)

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        """Tokens of ``messages`` as one request (estimated if the counter raises)."""
        return self._count(
            "messages",
            lambda: self.inner.count_messages(messages),
            lambda: self._estimate.count_messages(messages),
        )

    def count_message(self, message: AnyMessage) -> int:
        """Tokens of one message without reply priming (estimated if the counter raises)."""
        own = getattr(self.inner, "count_message", None)

        def exact() -> int:
            return int(own(message)) if callable(own) else self.inner.count_messages([message])

        return self._count("a message", exact, lambda: self._estimate.count_message(message))

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of tool definitions (estimated if the counter raises)."""
        return self._count(
            "tools", lambda: self.inner.count_tools(tools), lambda: self._estimate.count_tools(tools)
        )


def tolerant(counter: TokenCounter) -> TokenCounter:
    """``counter`` behind a ``FallbackCounter`` (the same wrapper for the same counter instance).

    The built-in counters do not raise on any text and are returned as they are; so is a
    counter that is already tolerant.
    """
    if isinstance(counter, FallbackCounter) or type(counter).__module__ in _TOLERANT_MODULES:
        return counter
    try:
        with _LOCK:
            wrapper = _WRAPPERS.get(counter)
            if wrapper is None:
                wrapper = _WRAPPERS[counter] = FallbackCounter(counter)
        return wrapper
    except TypeError:  # not weak-referenceable or not hashable: warn once per wrapper instead
        return FallbackCounter(counter)
