"""In-process backends: as correct as the others (locks, CAS, dedupe), not durable."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ctxcore.messages import AnyMessage
from ctxcore.state.keys import ConversationKey

__all__ = ["MemoryOffloadStore"]


class MemoryOffloadStore:
    """Offloaded originals in a dict, keyed by conversation and handle."""

    def __init__(self) -> None:
        self._data: dict[ConversationKey, dict[str, tuple[AnyMessage, ...]]] = {}
        self._lock = threading.Lock()

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Store ``messages`` under ``handle`` unless the handle exists."""
        with self._lock:
            handles = self._data.setdefault(key, {})
            if handle in handles:
                return False
            handles[handle] = tuple(messages)
            return True

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None."""
        with self._lock:
            found = self._data.get(key, {}).get(handle)
        return list(found) if found is not None else None

    def delete(self, key: ConversationKey) -> None:
        """Forget every offload of ``key``."""
        with self._lock:
            self._data.pop(key, None)
