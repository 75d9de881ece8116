"""``WindowCounter``: one window's token counter, each message counted once.

Serving a window counts the same tail several times: each rule's headroom, the view before
and after the fallback, the statistics. The built-in counters cache by content, but
building that cache key (role, content, calls) for every message on every count cost more
than the rest of a window at a 50-message tail (profiled in bench/README, fast path).
Messages are immutable, so within one window a message object's count is fixed: this
counter remembers it by identity, holding a reference so the identity cannot be reused.
Build one per window and drop it after; it is not meant to be shared between threads.
Without it (nor the stored counts it is seeded with) an agent step at a 51-message tail took
1.11-1.19x as long (bench/fast_path.py ``--caches``, issue 41): under the 20% a cache must
earn, kept while the step is still slower than before the issue's other removals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxcore.messages import AnyMessage
from ctxcore.tokens import TokenCounter

__all__ = ["WindowCounter"]


class WindowCounter:
    """``inner`` (made tolerant) with per-window memoisation of message and tool counts."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner.tolerant()
        # A request's count is composed from single messages only where the counter says
        # how (the built-in framing); any other counter counts each request itself.
        self.reply_priming = inner.reply_priming
        self.encoding_name = inner.encoding_name
        self._messages: dict[int, tuple[AnyMessage, int]] = {}
        self._tools: dict[tuple[int, ...], tuple[Sequence[Mapping[str, Any]], int]] = {}

    def tolerant(self) -> TokenCounter:
        """Itself: its inner counter is tolerant."""
        return self

    def count_text(self, text: str) -> int:
        """Tokens of ``text``."""
        return self.inner.count_text(text)

    def count_message(self, message: AnyMessage) -> int:
        """Tokens of one message without the reply priming (counted once per object)."""
        # The memo holds each message it counted, so an id in it names that same object.
        found = self._messages.get(id(message))
        if found is not None:
            return found[1]
        value = self.inner.count_message(message)
        self._messages[id(message)] = (message, value)
        return value

    def seed(self, message: AnyMessage, count: int) -> None:
        """Take ``count`` as ``message``'s count (a count the log stored at append)."""
        self._messages[id(message)] = (message, count)

    def sum_messages(self, messages: Sequence[AnyMessage]) -> int:
        """The sum of ``count_message`` over ``messages`` (no request framing)."""
        # One loop over the memo, not a method call per message: a window sums its tail
        # half a dozen times (each rule's headroom, each view, the statistics).
        memo = self._messages
        total = 0
        for message in messages:
            found = memo.get(id(message))
            total += found[1] if found is not None else self.count_message(message)
        return total

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        """Tokens of ``messages`` as one request."""
        if self.reply_priming is None:
            return self.inner.count_messages(messages)
        if not messages:
            return 0
        return self.sum_messages(messages) + self.reply_priming

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of tool definitions (the same definition objects counted once)."""
        key = tuple(id(t) for t in tools)
        found = self._tools.get(key)
        if found is not None:
            return found[1]
        value = self.inner.count_tools(tools)
        self._tools[key] = (list(tools), value)
        return value
