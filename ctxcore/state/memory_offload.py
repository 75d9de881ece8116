"""``MemoryOffloadStore``: offloaded originals in a dict (the in-process ``OffloadStore``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ctxcore.messages import AnyMessage
from ctxcore.state.filesystem import no_files, put_one, validate_handle
from ctxcore.state.keys import ConversationKey

__all__ = ["MemoryOffloadStore"]


class MemoryOffloadStore:
    """Offloaded originals in a dict, keyed by conversation and handle."""

    def __init__(self) -> None:
        self._data: dict[ConversationKey, dict[str, tuple[AnyMessage, ...]]] = {}
        self._lock = threading.Lock()

    put_if_absent = put_one

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        """``put_if_absent`` of each item, under one lock."""
        for handle, _ in items:
            validate_handle(handle)
        with self._lock:
            handles = self._data.setdefault(key, {})
            written: list[bool] = []
            for handle, messages in items:
                written.append(handle not in handles)
                handles.setdefault(handle, tuple(messages))
            return written

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None."""
        validate_handle(handle)
        with self._lock:
            found = self._data.get(key, {}).get(handle)
        return list(found) if found is not None else None

    files = no_files

    def delete(self, key: ConversationKey) -> None:
        """Forget every offload of ``key``."""
        with self._lock:
            self._data.pop(key, None)
