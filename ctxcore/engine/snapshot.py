"""Snapshots of an embedded context (``ModelContext.save_state`` / ``load_state``), as JSON-ready dicts.

Format 2 (current) adds ``"offloads": {handle: messages}``: the originals the view's offload
markers point to, so a context restored in another process (with another ``OffloadStore``)
can still ``reload`` them. Format 1 (no offloads) still loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxcore.errors import UsageError
from ctxcore.messages import AnyMessage, message_text, messages_from_json, messages_to_json
from ctxcore.processors.offload import OFFLOAD_MARKER_RE

__all__ = ["STATE_FORMAT", "ContextSnapshot", "dump_snapshot", "load_snapshot", "offload_handles"]

STATE_FORMAT = 2
_READABLE_FORMATS = (1, 2)


@dataclass
class ContextSnapshot:
    """What a context's state consists of, decoded."""

    raw: list[AnyMessage]
    view: list[AnyMessage]
    derived: list[str] = field(default_factory=list)
    derived_seq: int = 0
    last_window_access: float | None = None
    processors: list[dict[str, Any]] = field(default_factory=list)
    offloads: dict[str, list[AnyMessage]] = field(default_factory=dict)
    usage_fresh_after: str | None = None
    # The recall archive's index (``ContextArchive.dump``), when recall is on.
    archive: dict[str, Any] | None = None
    # The highest log id ever assigned (ids are never reused after ``truncate_after``);
    # snapshots without it take the newest raw message's.
    log_seq: int = 0


def _dump(messages: Sequence[AnyMessage]) -> list[Any]:
    return list(json.loads(messages_to_json(messages)))


def _load(data: Any) -> list[AnyMessage]:
    return messages_from_json(json.dumps(data))


def offload_handles(messages: Sequence[AnyMessage]) -> list[str]:
    """The distinct offload handles named by markers in ``messages``, in order of appearance."""
    found: dict[str, None] = {}
    for message in messages:
        for handle, _, _ in OFFLOAD_MARKER_RE.findall(message_text(message)):
            found.setdefault(handle, None)
    return list(found)


def dump_snapshot(snapshot: ContextSnapshot, context_id: str, session_id: str | None) -> dict[str, Any]:
    """The JSON-ready dict of ``snapshot`` (format ``STATE_FORMAT``)."""
    return {
        "format": STATE_FORMAT,
        "context_id": context_id,
        "session_id": session_id,
        "raw": _dump(snapshot.raw),
        "view": _dump(snapshot.view),
        "derived": sorted(snapshot.derived),
        "derived_seq": snapshot.derived_seq,
        "last_window_access": snapshot.last_window_access,
        "processors": snapshot.processors,
        "offloads": {handle: _dump(messages) for handle, messages in snapshot.offloads.items()},
        "usage_fresh_after": snapshot.usage_fresh_after,
        "archive": snapshot.archive,
        "log_seq": snapshot.log_seq,
    }


def load_snapshot(state: Mapping[str, Any], processor_names: Sequence[str]) -> ContextSnapshot:
    """Decode what ``dump_snapshot`` wrote (format 1 or 2) for a context with ``processor_names``.

    Raises ``UsageError`` for another format or another processor chain.
    """
    version = state.get("format")
    if version not in _READABLE_FORMATS:
        raise UsageError(
            f"unsupported context state format {version!r}: this version reads formats {list(_READABLE_FORMATS)}"
        )
    saved = list(state.get("processors", []))
    if [s.get("type") for s in saved] != list(processor_names):
        raise UsageError(
            f"the saved state was made with another processor chain ({[s.get('type') for s in saved]}, "
            f"this context has {list(processor_names)})"
        )
    offloads: Mapping[str, Any] = (state.get("offloads") or {}) if version >= 2 else {}
    raw = _load(state["raw"])
    newest = max(
        (int(str(m.context_message_id)) for m in raw if str(m.context_message_id).isdigit()), default=0
    )
    return ContextSnapshot(
        raw=raw,
        view=_load(state["view"]),
        derived=list(state.get("derived", [])),
        derived_seq=int(state.get("derived_seq", 0)),
        last_window_access=state.get("last_window_access"),
        processors=saved,
        offloads={str(handle): _load(messages) for handle, messages in offloads.items()},
        usage_fresh_after=state.get("usage_fresh_after"),
        archive=state.get("archive"),
        log_seq=max(int(state.get("log_seq") or 0), newest),
    )
