"""One window's reads in one round trip on Redis.

The state, the pinned entries, the tail, the compaction hash (failure record and the
scheduler's mirrored status) and the log's end, with the budget written only when it
changed: all keys in the conversation's slot, so on Redis Cluster the round trip goes to one
node. With a retention the read also returns the log counter's ``PTTL``, and
``refresh_due`` says when the caller should ``refresh`` the conversation's expiry (at most
hourly: windows rarely write for it). With ``index_version`` it returns the recall index
when the state names a newer one than the caller holds.

Two shapes of the one round trip. Knowing the cursor the conversation's last window had
(kept per conversation in this process), the reader sends ``WINDOW_META_LUA`` (everything
but the tail) and a native ``XREVRANGE`` of the newest page after that cursor in one
``MULTI``/``EXEC``.
A compaction only moves the cursor forward, so the page holds the tail after the new cursor
too; the page is used when it holds the whole tail (the usual case: workers keep up) under
the run's encoding. Otherwise (no cursor known, a rollback moved it back, a tail longer
than a page, another encoding) the same round trip is made with ``WINDOW_LUA``, which reads
the tail newest first until the stored counts fill the budget.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import redis
from redis.exceptions import NoScriptError

from ctxcore.state.base import check_pinned, format_log_id
from ctxcore.state.decoded import DecodedEntries, DecodedStates, Row, decoded_rows
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis_common import as_bytes, text, translated
from ctxcore.state.redis_retention import RedisRetention
from ctxcore.state.redis_tail import decode_rows
from ctxcore.state.redis_window_scripts import WINDOW_KEY_SUFFIXES, WINDOW_LUA, WINDOW_META_LUA
from ctxcore.state.tail import TAIL_PAGE, TailRead
from ctxcore.state.window_read import WindowRead

__all__ = ["RedisWindowReader"]

# Conversations whose last cursor a reader remembers (an int each); past it the memory is
# dropped and each conversation's next window takes the script-only shape once.
_CURSORS_KEPT = 65_536
# The cursor is remembered (and the next read pipelines the page) only after a tail of at
# most this many entries: the page holds it with room for the appends in between (an agent
# appends a step or two per window), so a long tail does not pay a page it cannot use before
# the script.
_SHORT_TAIL = TAIL_PAGE * 3 // 4


class RedisWindowReader:
    """Reads windows for the stores of one prefix (``RedisStateStore``/``RedisMessageLog``)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        retention: RedisRetention | None = None,
        decoded: DecodedEntries | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        # Consecutive windows read the same page: its entries are decoded once per process.
        self.decoded = decoded if decoded is not None else DecodedEntries()
        self.states = DecodedStates()
        self._script = client.register_script(WINDOW_LUA)
        self._meta = client.register_script(WINDOW_META_LUA)
        self.retention = retention or RedisRetention(client, prefix)
        self._cursors: dict[ConversationKey, int] = {}
        self._lock = threading.Lock()
        # How many reads the meta script and the page served (tests read it).
        self.paged_reads = 0

    def refresh(self, key: ConversationKey) -> None:
        """Give the conversation its full retention again (when ``refresh_due``)."""
        self.retention.refresh(key)

    def _keys(self, key: ConversationKey) -> list[str]:
        return [f"{self.prefix}:{key.hash_tag}:{s}" for s in WINDOW_KEY_SUFFIXES]

    def read(
        self, key: ConversationKey, budget_tokens: int, encoding: str, index_version: int | None = None
    ) -> WindowRead:
        """The window's reads; the budget recorded when it differs from the stored one.
        ``index_version``: the recall index version the caller holds (None: recall off)."""
        ttl = self.retention.ttl_ms(key)
        args: list[str | int] = [
            budget_tokens,
            TAIL_PAGE,
            encoding,
            ttl,
            "" if index_version is None else index_version,
        ]
        keys = self._keys(key)
        hint = self._cursors.get(key)
        with translated(f"window read of {key}"):
            if hint is not None:
                try:
                    meta, page = self._pipelined(keys, args, hint)
                except NoScriptError:
                    # A restarted or flushed server lost its scripts: load this one again.
                    self._meta.sha = self.client.script_load(WINDOW_META_LUA)
                    meta, page = self._pipelined(keys, args, hint)
                rows = _page_rows(meta, page, hint, encoding)
                if rows is not None:
                    self.paged_reads += 1
                    return self._parsed(key, [*meta[:2], [0, 0, 0, (), ()], *meta[3:]], ttl, rows)
            reply = self._script(keys=keys, args=args)
        return self._parsed(key, reply, ttl)

    def _pipelined(self, keys: list[str], args: list[str | int], hint: int) -> tuple[list[Any], list[Any]]:
        """``WINDOW_META_LUA`` and the newest page after ``hint``, in one round trip."""
        # MULTI/EXEC: the page is read at the instant the script ran (one slot, so one node on
        # a cluster too).
        pipe = self.client.pipeline(transaction=True)
        # EVALSHA by hand: a Script called on a pipeline checks SCRIPT EXISTS first, a round
        # trip of its own on every execute, and a cluster pipeline refuses the typed evalsha
        # (execute_command is untyped upstream).
        pipe.execute_command("EVALSHA", self._meta.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
        pipe.xrevrange(keys[3], "+", f"{hint + 1}-0", count=TAIL_PAGE)
        meta, page = pipe.execute()
        return list(meta), list(page)

    def _parsed(
        self,
        key: ConversationKey,
        reply: list[Any],
        ttl: int,
        page: tuple[list[Row], list[int | None]] | None = None,
    ) -> WindowRead:
        """The read from a script's reply; ``page``: the tail's rows and counts, read apart."""
        state, pinned, tail, compaction, last, left, cursor, index = reply
        first, omitted_last, omitted, entries, anchors = tail
        if page is not None:
            messages, counts = self.decoded.decode(page[0], decoded_rows), page[1]
        else:
            messages, counts = decode_rows(entries, self.decoded)
        last_seq = int(last)
        if (state is not None or last_seq > 0) and not int(first) and len(messages) <= _SHORT_TAIL:
            self._remember(key, int(cursor))
        elif key in self._cursors:
            with self._lock:
                self._cursors.pop(key, None)
        pinned_messages, _ = decode_rows(pinned, self.decoded)
        extra, _ = decode_rows(anchors, self.decoded)
        fields: list[Any] = list(compaction)
        decoded = self.states.decode(as_bytes(state)) if state is not None else None
        check_pinned(key, decoded, pinned_messages)
        return WindowRead(
            state=decoded,
            pinned=pinned_messages,
            tail=TailRead(
                messages=messages,
                counts=counts,
                omitted=(format_log_id(int(first)), format_log_id(int(omitted_last))) if int(first) else None,
                omitted_tokens=int(omitted),
                anchors=extra,
            ),
            compaction={text(fields[i]): text(fields[i + 1]) for i in range(0, len(fields), 2)},
            compaction_key=self._keys(key)[7],
            last_id=format_log_id(last_seq) if last_seq > 0 else None,
            refresh_due=bool(ttl)
            and (state is not None or last_seq > 0)
            and self.retention.refresh_due(key, int(left)),
            index=_index_bytes(index),
        )

    def _remember(self, key: ConversationKey, cursor: int) -> None:
        if self._cursors.get(key) == cursor:
            return
        with self._lock:
            if len(self._cursors) >= _CURSORS_KEPT:  # a plain bound: forgetting costs one script read each
                self._cursors.clear()
            self._cursors[key] = cursor


def _page_rows(
    meta: list[Any], page: list[Any], hint: int, encoding: str
) -> tuple[list[Row], list[int | None]] | None:
    """The tail after the cursor ``meta`` read, as rows and counts taken from ``page`` (the
    newest entries after ``hint``); None when the page cannot stand for the tail (see the
    module docstring). A conversation that does not exist has the empty tail."""
    state, last, cursor = meta[0], int(meta[4]), int(meta[6])
    if state is None and last == 0:
        return [], []
    if cursor < hint:
        return None
    run_encoding, run_from = meta[2]
    if run_encoding is None or text(run_encoding) != encoding:
        return None  # counts under another encoding: the script reads them beside the log
    start = int(run_from) if run_from is not None else last + 1
    whole = len(page) < TAIL_PAGE
    rows: list[Row] = []
    counts: list[int | None] = []
    if page and not isinstance(page[0][1], dict):
        # A cluster transaction returns the raw reply: flat field lists, not dicts.
        page = [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in page]
    # Either decoding: field names as bytes, or as str (decode_responses=True).
    m, t = (b"m", b"t") if not page or b"m" in page[0][1] else ("m", "t")
    # Newest first: keep the entries after the cursor, oldest first in the result.
    for entry_id, fields in reversed(page):
        seq = int(as_bytes(entry_id).split(b"-", 1)[0])
        if seq <= cursor:
            whole = True  # the page reaches past the cursor: it holds the whole tail
            continue
        rows.append((seq, as_bytes(fields[m])))
        # Counts of the run only (an entry before it may hold an earlier run's count).
        count = fields.get(t) if seq >= start else None
        counts.append(int(count) if count is not None else None)
    return (rows, counts) if whole else None


def _index_bytes(value: Any) -> bytes | None:
    # Stored base64 (a client with decode_responses=True must be able to read it back).
    return base64.b64decode(as_bytes(value)) if value is not None else None
