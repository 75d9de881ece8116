"""``DecodedEntries``: log entries already decoded, reused by the next window's read.

An agent asks for a window after every step, and each window reads (nearly) the same tail
page again: decoding it with pydantic was a fifth of a window's time at a 50-message tail
(bench/README, fast path). A log entry never changes once written, and messages are frozen
models, so a decoded entry can be handed to every later window that reads the same bytes.

The key is the entry's seq *and* its stored bytes: a seq reused after ``truncate_after``
or after a conversation is deleted and re-created holds different bytes, and so misses.
The map is bounded by entries and by the bytes it holds (a tool output can be megabytes).
Without it an agent step (append + window) at a 51-message tail took 1.34-1.42x as long
(bench/fast_path.py ``--caches``, issue 41). Decoded states were cached the same way and
went: 1.0x (a cache must save more than 20% of the step).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ctxcore.messages import AnyMessage
from ctxcore.state.base import decode_log_messages, format_log_id

__all__ = ["DecodedEntries", "Row", "decoded_rows"]

# (the entry's seq, its stored bytes): the seq as the store returned it, so a read that
# finds every entry cached formats no log id at all.
Row = tuple[int, bytes]


class DecodedEntries:
    """A bounded LRU map ``(seq, stored bytes) -> decoded message``: bounded by entries and
    by the stored bytes its keys carry, locked (a service is shared by the threads of a web
    server)."""

    # 16 MB holds the budget-sized pages of ~100 busy conversations (a 32k-token page is
    # ~130 kB of JSON) without making each worker process much bigger.
    def __init__(self, max_entries: int = 16_384, max_bytes: int = 16 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("a decoded cache needs room for at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[Row, AnyMessage] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def decode(
        self, rows: Sequence[Row], decode: Callable[[Sequence[Row]], list[AnyMessage]]
    ) -> list[AnyMessage]:
        """The messages of ``rows``, in order: cached ones reused (they become the newest),
        the others decoded by ``decode`` in one call (which raises for a malformed entry,
        caching nothing); ``decoded_rows`` is that call for ``decode_log_messages``."""
        with self._lock:
            found = [self._data.get(row) for row in rows]
            for row, m in zip(rows, found, strict=True):
                if m is not None:
                    self._data.move_to_end(row)
        missing = [row for row, m in zip(rows, found, strict=True) if m is None]
        self.hits += len(rows) - len(missing)
        self.misses += len(missing)
        if not missing:
            return [m for m in found if m is not None]
        fresh = dict(zip(missing, decode(missing), strict=True))
        with self._lock:
            for row, m in fresh.items():
                if row not in self._data:
                    self._data[row] = m
                    self._bytes += len(row[1])
            # The oldest entries go while either bound is passed.
            while self._data and (len(self._data) > self.max_entries or self._bytes > self.max_bytes):
                old, _ = self._data.popitem(last=False)
                self._bytes -= len(old[1])
        return [m if m is not None else fresh[row] for m, row in zip(found, rows, strict=True)]


def decoded_rows(rows: Sequence[Row]) -> list[AnyMessage]:
    """``decode_log_messages`` of ``(seq, bytes)`` rows (the log ids formatted here)."""
    return decode_log_messages([(format_log_id(seq), raw) for seq, raw in rows])
