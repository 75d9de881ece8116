"""Where the fast path asks for background compaction: the ``CompactionQueue`` seam, and
``InlineQueue`` for tests and embedded use without workers (the workers' own queue is
``workers.tasks.CeleryQueue``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ctxcore.state import ConversationKey
from ctxcore.status import CompactionStatus
from workers.failures import FailureRecord

__all__ = ["CompactionQueue", "InlineQueue"]


class CompactionQueue(Protocol):
    """Where the fast path asks for background compaction."""

    def request(self, key: ConversationKey) -> CompactionStatus:
        """Ask for a compaction (coalesced); returns the conversation's status after asking."""
        ...

    def status(self, key: ConversationKey) -> CompactionStatus:
        """``idle``, ``queued``, ``running``, or ``failing`` while the last job failed."""
        ...

    def status_from(self, record: FailureRecord) -> CompactionStatus:
        """``status`` as the conversation's failure record (read beside the window) says it,
        for a queue whose status lives there (the scheduler mirrors it); else ``status``'s."""
        ...


class InlineQueue:
    """A queue that only records requests (tests, and embedded use without workers)."""

    def __init__(self, on_request: Callable[[ConversationKey], None] | None = None) -> None:
        self.requests: list[ConversationKey] = []
        self._on_request = on_request

    def request(self, key: ConversationKey) -> CompactionStatus:
        """Record the request and run the optional callback."""
        self.requests.append(key)
        if self._on_request is not None:
            self._on_request(key)
        return "queued" if self._on_request is None else "idle"

    def status(self, key: ConversationKey) -> CompactionStatus:
        """Always idle: nothing runs in the background."""
        return "idle"

    def status_from(self, record: FailureRecord) -> CompactionStatus:
        """Always idle, as ``status``."""
        return "idle"
