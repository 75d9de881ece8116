"""``tolerant(counter)``: a token counter that never breaks a window because the counter raised.

The reference falls back to ``len // 4`` when a counter fails (spec 2.5); so does ctxcore,
wherever a window is counted (statistics, ``assemble_window``, the Coordinator's views).
Whether a counter can raise is its own declaration (``TokenCounter.tolerant``): the
built-ins and the wrappers return themselves, a ``CounterBase`` its one ``FallbackCounter``.
"""

from __future__ import annotations

from ctxcore.tokens import FallbackCounter, TokenCounter

__all__ = ["FallbackCounter", "tolerant"]


def tolerant(counter: TokenCounter) -> TokenCounter:
    """``counter`` as it counts when a count may raise (``TokenCounter.tolerant``)."""
    return counter.tolerant()
