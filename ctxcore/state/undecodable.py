"""Log entries that no longer decode: never fatal.

A log entry written by an older version (or damaged in the store) that does not validate as
a message is read as a placeholder in its place: a ``SystemMessage`` with empty content,
its log id, and the reason in ``metadata["ctxcore_undecodable"]``. A system message is never
logged, so the placeholder cannot be taken for conversation content, and a reader that
forgot to leave it out fails loudly (``check_window``: a system message after the others)
instead of serving it. Readers decode entry by entry (``decode_entries``); the window, the
compaction view and append validation take the log through ``without_undecodable``, and
``GET .../messages`` lists the placeholders as undecodable with their ids.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pydantic import ValidationError

from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, messages_from_json

__all__ = ["UNDECODABLE_KEY", "decode_entries", "is_undecodable", "undecodable_entry", "without_undecodable"]

log = logging.getLogger(__name__)

UNDECODABLE_KEY = "ctxcore_undecodable"


def undecodable_entry(log_id: str, reason: str) -> SystemMessage:
    """The placeholder read in place of the log entry ``log_id`` (see the module docstring)."""
    return SystemMessage(content="", metadata={UNDECODABLE_KEY: reason}, context_message_id=log_id)


def is_undecodable(message: AnyMessage) -> bool:
    """True for a placeholder of an entry that did not decode."""
    return message.role == "system" and UNDECODABLE_KEY in message.metadata


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:])  # past the array index
        return f"{first.get('type', 'invalid')}{f' at {where}' if where else ''}: {first.get('msg', '')}"[
            :300
        ]
    return f"{type(exc).__name__}: {exc}"[:300]


def decode_entries(
    log_ids: Sequence[str], bodies: Sequence[bytes | None], reasons: Sequence[str]
) -> list[AnyMessage]:
    """Each entry decoded on its own: a body that fails (or a None body, with its reason
    in ``reasons``) becomes its placeholder, logged once at WARNING with the cause."""
    out: list[AnyMessage] = []
    for log_id, body, reason in zip(log_ids, bodies, reasons, strict=True):
        if body is not None:
            try:
                out.append(messages_from_json(b"[" + body + b"]")[0])
                continue
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                reason = _reason(exc)
        log.warning(
            "log entry %s does not decode (%s): left out of windows, listed as undecodable", log_id, reason
        )
        out.append(undecodable_entry(log_id, reason))
    return out


def without_undecodable(messages: Sequence[AnyMessage]) -> tuple[list[AnyMessage], list[tuple[str, str]]]:
    """``messages`` without the placeholders and without the tool results that answered
    them, and the ``(first, last)`` log-id ranges so left out.

    A result is taken for an answer to a left-out message when it no longer answers an
    unanswered call of the assistant message right before it (with only results between):
    the results of a lost assistant message go with it, a lost result's siblings stay (its
    own call is then answered as interrupted in served windows).
    """
    if not any(is_undecodable(m) for m in messages):
        return list(messages), []
    kept: list[AnyMessage] = []
    ranges: list[tuple[str, str]] = []
    calls: set[str] = set()  # the open step's unanswered calls
    dropping = False  # inside a left-out run: its results go too
    for message in messages:
        log_id = message.context_message_id or ""
        if is_undecodable(message):
            if dropping and ranges:
                ranges[-1] = (ranges[-1][0], log_id)
            else:
                ranges.append((log_id, log_id))
            dropping = True
            continue
        if message.role == "tool":
            if message.tool_call_id in calls:
                calls.discard(message.tool_call_id)
                kept.append(message)
            elif dropping and ranges:
                ranges[-1] = (ranges[-1][0], log_id)
            else:
                kept.append(message)  # not ours to judge: check_window will
            continue
        dropping = False
        calls = {c.id for c in message.tool_calls} if isinstance(message, AssistantMessage) else set()
        kept.append(message)
    return kept, ranges
