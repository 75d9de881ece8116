"""A per-process cache of deserialised recall indexes, keyed by conversation and version.

The fast path and the recall route load a conversation's index with one read and keep it;
a state naming a newer ``archive_version`` makes them read it again. Keys are the
``ConversationKey`` itself, never a joined string, so ``tenant-a/x`` and ``tenant_a/x``
can never share an entry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from ctxcore.recall.index import RecallIndex
from ctxcore.state.keys import ConversationKey

__all__ = ["IndexCache"]


class IndexCache:
    """Least-recently-used ``RecallIndex`` per conversation (at most ``size`` of them)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._entries: OrderedDict[ConversationKey, tuple[int, RecallIndex]] = OrderedDict()
        self._lock = threading.Lock()

    def version(self, key: ConversationKey) -> int:
        """The version of the index held for ``key`` (0: none): a read can skip an index
        that is not newer."""
        with self._lock:
            found = self._entries.get(key)
        return found[0] if found is not None else 0

    def put(self, key: ConversationKey, data: bytes) -> RecallIndex:
        """Keep the index stored as ``data`` (read beside something else) for ``key``."""
        index = RecallIndex.from_bytes(data)
        with self._lock:
            self._entries[key] = (index.version, index)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return index

    def get(self, key: ConversationKey, version: int, load: Callable[[], bytes | None]) -> RecallIndex | None:
        """The index of ``key`` at ``version`` or newer; ``load`` reads it when the cached one is older."""
        if version <= 0:
            return None
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found[0] >= version:
                self._entries.move_to_end(key)
                return found[1]
        data = load()
        if data is None:
            return None
        return self.put(key, data)
