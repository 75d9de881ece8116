"""Offloads of one rule chain written together: one store call per conversation, not per result.

A window whose tail is over budget clears dozens of tool results, each offloaded. Written
one at a time that is one round trip each (about 76 per window at a 500-message tail);
``DeferredOffloads`` collects them while the chain runs and ``flush`` writes them with
``put_many_if_absent`` (one script call on Redis). Handles are content hashes, so what the rules put
in the view does not depend on when the write happens; if the flush fails, the caller runs
the chain again on the store itself, whose per-message failures keep messages unchanged
(nothing may leave the view without a way back).
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage
from ctxcore.state.base import FileKeeper, OffloadStore
from ctxcore.state.filesystem import validate_handle
from ctxcore.state.keys import ConversationKey

__all__ = ["DeferredOffloads"]


class DeferredOffloads:
    """An ``OffloadStore`` that keeps puts until ``flush``; markers and archives are the store's.

    ``put_if_absent`` answers True for a handle not yet pending here: whether the store
    already held it is known only at the flush (no caller depends on it).
    """

    def __init__(self, store: OffloadStore) -> None:
        self.store = store
        self._pending: dict[ConversationKey, dict[str, tuple[AnyMessage, ...]]] = {}

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Queue ``messages`` under ``handle`` (False if that handle is queued already)."""
        pending = self._pending.setdefault(key, {})
        if validate_handle(handle) in pending:
            return False
        pending[handle] = tuple(messages)
        return True

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        """Queue each (handle, messages) as ``put_if_absent`` does."""
        return [self.put_if_absent(key, handle, messages) for handle, messages in items]

    def files(self) -> FileKeeper | None:
        """The store's: markers name where the offload will be."""
        return self.store.files()

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """A queued offload, else the store's."""
        queued = self._pending.get(key, {}).get(handle)
        return list(queued) if queued is not None else self.store.get(key, handle)

    def delete(self, key: ConversationKey) -> None:
        """Drop what is queued for ``key`` and delete the store's offloads of it."""
        self._pending.pop(key, None)
        self.store.delete(key)

    @property
    def pending(self) -> int:
        """Offloads queued and not yet written."""
        return sum(len(handles) for handles in self._pending.values())

    def flush(self) -> None:
        """Write everything queued: one ``put_many_if_absent`` per conversation. Raises what the store raises."""
        while self._pending:
            key, handles = next(iter(self._pending.items()))
            self.store.put_many_if_absent(key, list(handles.items()))
            del self._pending[key]
