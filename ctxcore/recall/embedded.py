"""``ContextArchive``: the recall archive of one embedded context.

The context holds it: an embedded compressor archives what it folds after its benefit
check and before the messages change; ``save_state`` / ``load_state`` carry the index
(rebuilt from its bytes on load); a store that keeps archives (``FilesystemOffloadStore``:
``archive.sqlite`` in the conversation's folder, no symlinks, nothing outside its root)
has a copy after every fold, from which a new context of the same key starts.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Sequence
from typing import Any

from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.recall.archive import ChunkingConfig, RecallAnswer, archive_messages, fully_archived, recall
from ctxcore.recall.auto import AutoRecall, RecallStats, recalled_message
from ctxcore.recall.index import RecallIndex
from ctxcore.state.base import ArchiveKeeper
from ctxcore.state.keys import ConversationKey
from ctxcore.tokens import TokenCounter

__all__ = ["ArchiveKeeper", "ContextArchive"]


class ContextArchive:
    """What the context's compressors folded, archived and searchable (see module docstring)."""

    def __init__(
        self,
        key: ConversationKey,
        counter: TokenCounter,
        chunking: ChunkingConfig,
        keeper: ArchiveKeeper | None = None,
    ) -> None:
        self.key = key
        self.counter = counter
        self.chunking = chunking
        self._keeper = keeper
        self._lock = threading.Lock()
        stored = self._keeper.get_archive(key) if self._keeper is not None else None
        self._index: RecallIndex | None = RecallIndex.from_bytes(stored) if stored is not None else None

    def fold(self, originals: Sequence[AnyMessage]) -> None:
        """Archive ``originals`` (log messages as added) that are not archived yet."""
        with self._lock:
            self._index, write = archive_messages(self._index, originals, self.counter, self.chunking)
            if write is not None and self._keeper is not None:
                self._keeper.put_archive(self.key, write.index)

    def covers(self, first_id: str, last_id: str, skip: frozenset[str] = frozenset()) -> bool:
        """True when every log id of the range (but ``skip``) is archived."""
        with self._lock:
            return self._index is not None and fully_archived(self._index, first_id, last_id, skip)

    def recall(self, query: str, max_tokens: int) -> RecallAnswer:
        """The recall search over this context's archive."""
        with self._lock:
            index = self._index
        return recall(index, query, max_tokens, self.counter)

    def recalled(
        self, query: str, room: int, held: frozenset[str], max_ratio: float, budget: int
    ) -> tuple[UserMessage | None, RecallStats]:
        """The auto-recall message for a window with ``room`` tokens left (see ``recall.auto``)."""
        with self._lock:
            index = self._index
        if index is None:
            return None, RecallStats(0, 0, 0.0)
        return recalled_message(
            AutoRecall(index, max_ratio), query, min(room, int(budget * max_ratio)), held, self.counter
        )

    def dump(self) -> dict[str, Any] | None:
        """The index for ``save_state`` (None: nothing archived)."""
        with self._lock:
            if self._index is None:
                return None
            return {
                "version": self._index.version,
                "index": base64.b64encode(self._index.to_bytes()).decode(),
            }

    def load(self, data: dict[str, Any] | None) -> None:
        """Restore what ``dump`` returned (None: nothing archived)."""
        index = RecallIndex.from_bytes(base64.b64decode(data["index"])) if data else None
        with self._lock:
            self._index = index
            if index is not None and self._keeper is not None:
                self._keeper.put_archive(self.key, index.to_bytes())
