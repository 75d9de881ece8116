"""Stored token counts and newest-first tail reads: the ``CountedLog`` capability.

A log that implements ``CountedLog`` stores, at append, each entry's token count under the
default encoding (``engine.tokenizer_model``) and keeps a running total per conversation,
so the fast path reads only the newest part of a long tail: pages of ``TAIL_PAGE`` entries,
newest first and never past the cursor, until the stored counts of what was read fill the
budget. What it did not read is summed from the running totals, without reading it.

The counted *run* is the log's suffix appended through ``append_counted`` with one
encoding. A plain ``append`` (or one with another default encoding) ends it: entries outside
the run (logged before counts were stored, or by a writer that does not count) stay valid,
they are counted on read, and a tail that holds any is read whole. The run also records which
entries are real user messages (per the appender's detector), so a paged tail still serves
its anchors. Counts under other encodings are stored on first use (``store_counts``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ctxcore.errors import StoreError
from ctxcore.messages import AnyMessage
from ctxcore.state.keys import ConversationKey

__all__ = ["TAIL_PAGE", "AppendCounts", "CountedLog", "TailPlan", "TailRead", "check_counts", "plan_tail"]

TAIL_PAGE = 128
"""Entries per newest-first page of a tail read."""


@dataclass(frozen=True)
class AppendCounts:
    """What ``append_counted`` stores beside each message of its batch (same order)."""

    encoding: str
    counts: Sequence[int]
    real: Sequence[bool]


@dataclass
class TailRead:
    """The part of a conversation's tail (log ids after the cursor) that a window reads.

    ``messages`` are the newest entries, oldest first (the whole tail when ``omitted`` is
    None); ``counts[i]`` is the stored count of ``messages[i]`` under the requested encoding
    (None: count it). ``omitted`` names the older entries left unread (first, last log id),
    ``omitted_tokens`` their stored total under the run's encoding and ``anchors`` the real
    user messages among them that can be the window's anchors (the first after the cursor
    and the latest), oldest first.
    """

    messages: list[AnyMessage]
    counts: list[int | None]
    omitted: tuple[str, str] | None = None
    omitted_tokens: int = 0
    anchors: list[AnyMessage] = field(default_factory=list)


@runtime_checkable
class CountedLog(Protocol):
    """A ``MessageLog`` that stores token counts and reads tails newest first."""

    def append_counted(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        counts: AppendCounts,
        *,
        expected_last_id: str | None = None,
    ) -> list[str]:
        """``MessageLog.append`` storing ``counts`` beside the new entries (the running total
        advances in the same atomic step)."""
        ...

    def read_tail(
        self, key: ConversationKey, cursor: str | None, *, budget_tokens: int, encoding: str
    ) -> TailRead:
        """The newest entries after ``cursor`` whose stored counts fill ``budget_tokens``
        (everything when the tail fits, or when it holds entries outside the counted run)."""
        ...

    def store_counts(self, key: ConversationKey, encoding: str, counts: Mapping[str, int]) -> None:
        """Keep counts under ``encoding`` (not the run's) of the entries named by log id."""
        ...


def check_counts(messages: Sequence[AnyMessage], counts: AppendCounts) -> AppendCounts:
    """``counts`` when it has one count and one flag per message, counts non-negative
    (``StoreError`` otherwise)."""
    if len(counts.counts) != len(messages) or len(counts.real) != len(messages):
        raise StoreError(
            f"append_counted got {len(messages)} messages but {len(counts.counts)} counts and "
            f"{len(counts.real)} flags: give one of each per message"
        )
    if not counts.encoding or any(isinstance(c, bool) or int(c) < 0 for c in counts.counts):
        raise StoreError("append_counted needs an encoding name and non-negative integer counts")
    return counts


@dataclass(frozen=True)
class TailPlan:
    """Which part of a tail to read: ``entries[start:]`` of the log's ids, after the cursor
    at ``cursor_index`` (``entries[cursor_index:start]`` are left out)."""

    cursor_index: int
    start: int
    omitted_tokens: int
    anchors: tuple[int, ...]


def plan_tail(
    seqs: Sequence[int],
    counts: Sequence[int | None],
    totals: Sequence[int | None],
    run_from: int | None,
    real: Sequence[int],
    after: int,
    budget_tokens: int,
    page: int = TAIL_PAGE,
) -> TailPlan:
    """The newest-first page loop over in-memory columns (the memory log; Redis runs the
    same loop in Lua): ``seqs`` ascending, ``counts``/``totals`` each entry's stored count
    and running total (None outside the run), ``real`` the run's real-user seqs ascending."""
    first = bisect.bisect_right(seqs, after)
    if first == len(seqs) or run_from is None or seqs[first] < run_from:
        return TailPlan(first, first, 0, ())  # entries outside the run: read whole
    start, read = len(seqs), 0
    while start > first and read < budget_tokens:
        lower = max(first, start - page)
        read += sum(c or 0 for c in counts[lower:start])
        start = lower
    if start == first:
        return TailPlan(first, first, 0, ())
    base = totals[first - 1] if first > 0 and seqs[first - 1] >= run_from else 0
    omitted = (totals[start - 1] or 0) - (base or 0)
    inside = real[bisect.bisect_right(real, after) : bisect.bisect_left(real, seqs[start])]
    anchors = tuple(sorted({inside[0], inside[-1]})) if inside else ()
    return TailPlan(first, start, omitted, anchors)
