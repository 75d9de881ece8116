"""Offloading originals to an ``OffloadStore`` and the markers that point back to them.

Handles are content hashes, not random ids: the same messages of the same conversation
always get the same handle, so offloading them twice writes once and the same input
always yields the same window (the fast path relies on that).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.markers import OFFLOAD_PREFIX
from ctxcore.messages import AnyMessage, message_text, messages_to_json
from ctxcore.state.base import OffloadStore
from ctxcore.state.keys import ConversationKey

__all__ = [
    "OFFLOAD_MARKER_RE",
    "HandleMemo",
    "Offload",
    "find_offload_markers",
    "has_offload_marker",
    "offload_handle",
    "offload_marker",
    "store_offload",
]

logger = logging.getLogger(__name__)

HANDLE_HEX_CHARS = 16
OFFLOAD_MARKER_RE = re.compile(
    r"\[\[OFFLOAD: handle=([0-9a-f]{8,64}), type=([a-z_]+)(?:, path=([^\]\n]*))?\]\]"
)


@dataclass(frozen=True)
class Offload:
    """A successful offload: its handle, the marker to put in the view, whether it wrote."""

    handle: str
    marker: str
    written: bool


def offload_handle(key: ConversationKey, messages: Sequence[AnyMessage]) -> str:
    """First 16 hex digits of sha256 over (conversation, the messages with their log ids)."""
    digest = hashlib.sha256()
    digest.update(str(key).encode())
    digest.update(b"\x00")
    digest.update(messages_to_json(messages))
    return digest.hexdigest()[:HANDLE_HEX_CHARS]


class HandleMemo:
    """Handles of messages already offloaded, by the message object (held, so its id is not
    reused) and conversation: bounded, locked, meant to live as long as a service.

    The fast path's rules clear the same old tool results on every window, and the Redis
    log hands every window the same decoded objects (``ctxcore.state.decoded``): hashing
    each original's JSON again was a tenth of a window at a 500-message tail.
    """

    def __init__(self, max_entries: int = 16_384) -> None:
        self.max_entries = max_entries
        self._data: dict[tuple[str, int], tuple[AnyMessage, str]] = {}
        self._lock = threading.Lock()

    def handle(self, key: ConversationKey, message: AnyMessage) -> str:
        """``offload_handle(key, [message])``, computed once per message object."""
        slot = (str(key), id(message))
        with self._lock:
            found = self._data.get(slot)
        if found is not None and found[0] is message:
            return found[1]
        value = offload_handle(key, [message])
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data.clear()  # a plain bound: a miss costs one hash
            self._data[slot] = (message, value)
        return value


def offload_marker(handle: str, offload_type: str, path: str | None = None) -> str:
    """``[[OFFLOAD: handle=H, type=T]]``, with ``, path=P`` for files."""
    where = f", path={path}" if path is not None else ""
    return f"{OFFLOAD_PREFIX} handle={handle}, type={offload_type}{where}]]"


def has_offload_marker(message: AnyMessage) -> bool:
    """True if the message text already points at an offload (never offload it again)."""
    return OFFLOAD_PREFIX in message_text(message)


def find_offload_markers(text: str) -> list[str]:
    """Every complete offload marker in ``text``, in order."""
    return [m.group(0) for m in OFFLOAD_MARKER_RE.finditer(text)]


def _describe_store(store: OffloadStore, key: ConversationKey, handle: str) -> tuple[str, str | None]:
    # Stores that keep files say where; every other backend is addressed by handle only.
    path_for = getattr(store, "path_for", None)
    if callable(path_for):
        return "filesystem", str(path_for(key, handle))
    return str(getattr(store, "offload_type", "in_memory")), None


def store_offload(
    store: OffloadStore | None,
    key: ConversationKey,
    originals: Sequence[AnyMessage],
    handle: str | None = None,
) -> Offload | None:
    """Store ``originals`` under their content handle; None when there is no store or it failed.

    ``handle``: the originals' handle when the caller knows it (``HandleMemo``). A handle
    that already exists is not written again (``written`` is False) but still
    usable. A failing store is logged and reported as None so callers keep the message
    unchanged: nothing may leave the view without a way back.
    """
    if store is None or not originals:
        return None
    handle = handle or offload_handle(key, originals)
    try:
        written = store.put_if_absent(key, handle, originals)
        offload_type, path = _describe_store(store, key, handle)
    except Exception:
        logger.warning(
            "offload of %d message(s) for %s failed; keeping them", len(originals), key, exc_info=True
        )
        return None
    return Offload(handle, offload_marker(handle, offload_type, path), written)
