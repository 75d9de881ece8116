"""Log ids: a conversation's zero-padded counter, so string order is append order
(re-exported by ``ctxcore.state.base``, where the backends take them from)."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.errors import InvalidKeyError

__all__ = ["LOG_ID_WIDTH", "expected_seq", "format_log_id", "parse_log_id", "replayed_ids"]

LOG_ID_WIDTH = 12
"""Digits of a log id: a zero-padded per-conversation counter, so string order is append order."""


def format_log_id(seq: int) -> str:
    """The log id of the ``seq``-th message of a conversation (1-based)."""
    return f"{seq:0{LOG_ID_WIDTH}d}"


def parse_log_id(log_id: str) -> int:
    """The counter value behind ``log_id``; ``InvalidKeyError`` if it is not a log id."""
    if (
        not isinstance(log_id, str)
        or len(log_id) != LOG_ID_WIDTH
        or not log_id.isascii()
        or not log_id.isdigit()
    ):
        raise InvalidKeyError(f"invalid log id {log_id!r}: expected {LOG_ID_WIDTH} ASCII digits")
    return int(log_id)


def expected_seq(expected_last_id: str | None) -> int | None:
    """The counter value an ``expected_last_id`` names; None for no expectation.

    An id that is not a log id (or names the empty log) gives -1, which no log ends at, so
    the append reports a conflict naming the real last id instead of failing differently.
    """
    if expected_last_id is None:
        return None
    try:
        seq = parse_log_id(expected_last_id)
    except InvalidKeyError:
        return -1
    return seq if seq >= 1 else -1


def replayed_ids(
    known: Sequence[int | None], expected: int, following: Sequence[int] | None = None
) -> list[str] | None:
    """The ids to return when a batch under ``expected_last_id`` replays a call that succeeded.

    ``known[i]`` is the logged position of message i's ``message_id`` (None: no id, or not
    logged); ``following`` the log's ids above ``expected`` in order (at least
    ``len(known)`` of them when there are that many; default: ``expected+1, expected+2, ...``,
    a log without truncations). A replay has every message logged, and the distinct
    positions above ``expected`` are the log's next ids in batch order, at least one of
    them (positions at or below it are duplicates of older messages, as in the first call).
    Without ``message_id`` a replay cannot be told from a stale writer: that is a conflict.
    """
    nexts = list(following) if following is not None else [expected + 1 + i for i in range(len(known))]
    matched = 0
    for seq in known:
        if seq is None:
            return None
        if matched < len(nexts) and seq == nexts[matched]:
            matched += 1
        elif seq > (nexts[matched - 1] if matched else expected):
            return None
    if matched == 0:
        return None
    return [format_log_id(seq) for seq in known if seq is not None]
