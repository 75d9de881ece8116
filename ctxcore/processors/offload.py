"""Offloading originals to an ``OffloadStore`` and the markers that point back to them.

Handles are content hashes, not random ids: the same messages of the same conversation
always get the same handle, so offloading them twice writes once and the same input
always yields the same window (the fast path relies on that).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.markers import OFFLOAD_PREFIX
from ctxcore.messages import AnyMessage, message_text, messages_to_json
from ctxcore.state.base import OffloadStore
from ctxcore.state.keys import ConversationKey

__all__ = [
    "OFFLOAD_MARKER_RE",
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
    files = store.files()
    return ("filesystem", str(files.path_for(key, handle))) if files is not None else ("in_memory", None)


def store_offload(
    store: OffloadStore | None,
    key: ConversationKey,
    originals: Sequence[AnyMessage],
) -> Offload | None:
    """Store ``originals`` under their content handle; None when there is no store or it failed.

    A handle that already exists is not written again (``written`` is False) but still
    usable. (A memo of handles by message saved 0-2% of an agent step at a 51-message tail
    and went: bench/fast_path.py ``--caches``, issue 41.) A failing store is logged and reported as None so callers keep the message
    unchanged: nothing may leave the view without a way back.
    """
    if store is None or not originals:
        return None
    handle = offload_handle(key, originals)
    try:
        written = store.put_if_absent(key, handle, originals)
        offload_type, path = _describe_store(store, key, handle)
    except Exception:
        logger.warning(
            "offload of %d message(s) for %s failed; keeping them", len(originals), key, exc_info=True
        )
        return None
    return Offload(handle, offload_marker(handle, offload_type, path), written)
