"""The tail a window reads: stored counts and newest-first pages (``ctxcore.state.tail``).

``read_window_tail`` asks a ``CountedLog`` for the newest part of the tail whose stored
counts fill the budget and splices what it left unread behind the fallback's marker
(``ctxcore.assemble.elided_marker``) naming each left-out log-id range, keeping the real
user messages among them that can be the window's anchors. Logs without the capability,
and counters without an ``encoding_name`` (custom counters bypass stored counts), read the
whole tail as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxcore.assemble import elided_marker
from ctxcore.messages import AnyMessage, ToolMessage
from ctxcore.state import ConversationKey, MessageLog
from ctxcore.state.base import format_log_id, parse_log_id
from ctxcore.state.tail import CountedLog, TailRead
from ctxcore.turns import UserDetector
from ctxcore.window_counter import WindowCounter

__all__ = ["WindowTail", "read_window_tail"]


@dataclass
class WindowTail:
    """The tail handed to ``assemble_window`` and what it stands for beyond itself."""

    messages: list[AnyMessage]
    # Log-id ranges left unread, each behind one marker message in ``messages``.
    elided: list[tuple[str, str]] = field(default_factory=list)
    # Tokens of the left-out entries minus those of the markers standing for them, so the
    # trigger sees the whole tail: ``raw_tokens`` of the window plus this.
    raw_tokens_delta: int = 0


def read_window_tail(
    log: MessageLog,
    counted_log: CountedLog | None,
    key: ConversationKey,
    cursor: str | None,
    counter: WindowCounter,
    *,
    default_encoding: str | None,
    pinned: Sequence[AnyMessage],
    detector: UserDetector,
    read: TailRead | None,
) -> WindowTail:
    """The tail after ``cursor`` for one window counted by ``counter``: ``read`` when the log
    stores counts under ``counter``'s encoding (the window reader's, or ``counted_log``'s
    ``read_tail``), else the whole tail read here."""
    encoding = counter.encoding_name
    if read is None or encoding is None or counted_log is None:
        return WindowTail(log.read_after(key, cursor))
    counted: dict[str, int] = {}
    for message, count in zip(read.messages, read.counts, strict=True):
        if count is None:
            counted[message.context_message_id or ""] = counter.count_message(message)
        else:
            counter.seed(message, count)
    if counted and encoding != default_encoding:
        # Another encoding is counted on first use, then stored beside the run's counts.
        counted_log.store_counts(key, encoding, counted)
    if read.omitted is None:
        return WindowTail(read.messages)
    return _spliced(read, read.omitted, counter, pinned, detector)


def _spliced(
    read: TailRead,
    omitted: tuple[str, str],
    counter: WindowCounter,
    pinned: Sequence[AnyMessage],
    detector: UserDetector,
) -> WindowTail:
    first, last = (parse_log_id(i) for i in omitted)
    messages = list(read.messages)
    delta = read.omitted_tokens
    # The page may start inside a step: results whose call was left out go with it.
    while messages and isinstance(messages[0], ToolMessage):
        dropped = messages.pop(0)
        last = parse_log_id(dropped.context_message_id or format_log_id(last))
        delta += counter.count_message(dropped)
    anchors = list(read.anchors)
    # The candidates are the first real user message after the cursor (the task anchor
    # unless one is pinned) and the latest left out (the intent unless the page has one).
    if anchors and any(detector.is_real(m) for m in pinned):
        anchors = anchors[1:] if len(anchors) > 1 else anchors
    if len(anchors) > 1 and any(detector.real_flags(messages)):
        anchors = anchors[:1]
    out: list[AnyMessage] = []
    elided: list[tuple[str, str]] = []
    start = first
    for anchor in [*anchors, None]:
        stop = parse_log_id(anchor.context_message_id or "") if anchor is not None else last + 1
        if stop > start:
            lo, hi = format_log_id(start), format_log_id(stop - 1)
            marker = elided_marker(lo, hi, stop - start).model_copy(
                update={"context_message_id": f"{hi}~elided"}
            )
            out.append(marker)
            elided.append((lo, hi))
            delta -= counter.count_message(marker)
        if anchor is not None:
            out.append(anchor)
            delta -= counter.count_message(anchor)
            start = stop + 1
    return WindowTail([*out, *messages], elided, delta)
