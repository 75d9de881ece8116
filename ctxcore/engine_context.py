"""``ModelContext``: one conversation's context inside an agent process, and its persistence.

The class is assembled from layers, each a module with one job:
``engine_core.ContextCore`` (the log, the view, reads and direct writes),
``engine_hooks.ContextHooks`` (running processors: add, window, compress, recover) and
this module (``save_state`` / ``load_state``; the snapshot format is ``engine_state``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxcore.engine_hooks import ContextHooks
from ctxcore.engine_state import ContextSnapshot, dump_snapshot, load_snapshot, offload_handles
from ctxcore.state.filesystem import validate_handle

__all__ = ["ModelContext"]


class ModelContext(ContextHooks):
    """One conversation's context inside an agent process (synchronous).

    Create it with ``ContextEngine.create_context``. Thread-safe: processor runs are
    serialised by a per-context lock; reads take a short data lock. Attributes are
    documented on ``ContextCore``.
    """

    def save_state(self) -> dict[str, Any]:
        """A JSON-ready snapshot: log, view, derived ids, TTL clock, processor states, and the
        originals the view's offload markers point to (so ``reload`` works after a restore)."""
        with self._data_lock:
            view = list(self._view)
            snapshot = ContextSnapshot(
                raw=list(self._raw),
                view=view,
                derived=sorted(self._derived),
                derived_seq=self._derived_seq,
                last_window_access=self.last_window_access,
                processors=[{"type": name, "state": p.save_state()} for name, p in self.processors],
                usage_fresh_after=self.usage_fresh_after,
                archive=self.archive.dump() if self.archive is not None else None,
                log_seq=self._log_seq,
            )
        for handle in offload_handles(view):
            found = self.offload_store.get(self.key, handle)
            if found is not None:
                snapshot.offloads[handle] = found
        return dump_snapshot(snapshot, self.context_id, self.session_id)

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``save_state`` returned (the processor chain must be the same).

        Saved offloads are written to this context's offload store (an existing handle is
        kept: handles are content hashes). Snapshots of format 1 (without offloads) load too.

        Raises:
            CtxcoreError: the snapshot is of another format or another processor chain.
        """
        snapshot = load_snapshot(state, [name for name, _ in self.processors])
        for handle, messages in snapshot.offloads.items():
            self.offload_store.put_if_absent(self.key, validate_handle(handle), messages)
        with self._data_lock:
            self._raw = snapshot.raw
            self._by_id = {str(m.context_message_id): m for m in snapshot.raw}
            self._view = snapshot.view
            self._derived = set(snapshot.derived)
            self._derived_seq = snapshot.derived_seq
            self.last_window_access = snapshot.last_window_access
            self.usage_fresh_after = snapshot.usage_fresh_after
            self._log_seq = snapshot.log_seq
        for (_, processor), entry in zip(self.processors, snapshot.processors, strict=True):
            processor.load_state(entry.get("state", {}))
        if self.archive is not None:
            self.archive.load(snapshot.archive)
