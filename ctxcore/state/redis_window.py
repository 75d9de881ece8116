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
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import NoScriptError

from ctxcore.messages import AnyMessage
from ctxcore.state.base import check_budget, format_log_id
from ctxcore.state.decoded import DecodedEntries, DecodedStates
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.redis_common import as_bytes, text, translated
from ctxcore.state.redis_retention import RedisRetention
from ctxcore.state.redis_tail import decode_rows
from ctxcore.state.redis_window_scripts import WINDOW_KEY_SUFFIXES, WINDOW_LUA, WINDOW_META_LUA
from ctxcore.state.tail import TAIL_PAGE, TailRead

__all__ = ["RedisWindowReader", "WindowRead"]

# Conversations whose last cursor a reader remembers (an int each); past it the memory is
# dropped and each conversation's next window takes the script-only shape once.
_CURSORS_KEPT = 65_536
# The cursor is remembered (and the next read pipelines the page) only after a tail of at
# most this many entries: the page holds it with room for the appends in between (an agent
# appends a step or two per window), so a long tail does not pay a page it cannot use before
# the script.
_SHORT_TAIL = TAIL_PAGE * 3 // 4


@dataclass
class WindowRead:
    """What a window reads from its conversation's slot."""

    state: CompressionState | None
    pinned: list[AnyMessage]
    tail: TailRead
    # The compaction hash's fields (``workers.failures``): last error, backoff, mirrored status.
    compaction: dict[str, str] = field(default_factory=dict)
    last_id: str | None = None
    # True when the conversation's expiry is more than an hour below its full retention.
    refresh_due: bool = False
    # The stored recall index (decoded bytes) when the caller's copy was older, else None.
    index: bytes | None = None


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
        # How many reads took each shape (tests and benches read them).
        self.paged_reads = 0
        self.script_reads = 0

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
        check_budget(budget_tokens)
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
            reply: list[Any] | None = None
            if hint is not None:
                meta, page = self._pipelined(keys, args, hint)
                reply = _with_page(meta, page, hint, encoding)
            if reply is None:
                reply = self._script(keys=keys, args=args)
                self.script_reads += 1
            else:
                self.paged_reads += 1
        return self._parsed(key, reply, ttl)

    def _pipelined(self, keys: list[str], args: list[str | int], hint: int) -> tuple[list[Any], list[Any]]:
        """``WINDOW_META_LUA`` and the newest page after ``hint``, in one round trip."""
        for attempt in (0, 1):
            # MULTI/EXEC: the page is read at the instant the script ran (one slot, so one node
            # on a cluster too).
            pipe = self.client.pipeline(transaction=True)
            # EVALSHA by hand: a Script called on a pipeline checks SCRIPT EXISTS first, a
            # round trip of its own on every execute, and a cluster pipeline refuses the
            # typed evalsha (execute_command is untyped upstream).
            pipe.execute_command("EVALSHA", self._meta.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
            pipe.xrevrange(keys[3], "+", f"{hint + 1}-0", count=TAIL_PAGE)
            try:
                meta, page = pipe.execute()
            except NoScriptError:
                if attempt:
                    raise
                # A restarted or flushed server lost its scripts: load the script again.
                self._meta.sha = self.client.script_load(WINDOW_META_LUA)
                continue
            return list(meta), list(page)
        raise AssertionError("unreachable")  # pragma: no cover

    def _parsed(self, key: ConversationKey, reply: list[Any], ttl: int) -> WindowRead:
        state, pinned, tail, compaction, last, left, cursor, index = reply
        first, omitted_last, omitted, entries, anchors = tail
        last_seq = int(last)
        if (
            (state is not None or last_seq > 0) and not int(first) and len(entries) <= 3 * _SHORT_TAIL
        ):  # flat triples
            self._remember(key, int(cursor))
        elif key in self._cursors:
            with self._lock:
                self._cursors.pop(key, None)
        messages, counts = decode_rows(entries, self.decoded)
        pinned_messages, _ = decode_rows(pinned, self.decoded)
        extra, _ = decode_rows(anchors, self.decoded)
        fields: list[Any] = list(compaction)
        return WindowRead(
            state=self.states.decode(as_bytes(state)) if state is not None else None,
            pinned=pinned_messages,
            tail=TailRead(
                messages=messages,
                counts=counts,
                omitted=(format_log_id(int(first)), format_log_id(int(omitted_last))) if int(first) else None,
                omitted_tokens=int(omitted),
                anchors=extra,
            ),
            compaction={text(fields[i]): text(fields[i + 1]) for i in range(0, len(fields), 2)},
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


def _with_page(meta: list[Any], page: list[Any], hint: int, encoding: str) -> list[Any] | None:
    """``meta`` with its tail replaced by the page's entries after the cursor, in the shape
    ``WINDOW_LUA`` returns; None when the page cannot stand for the tail (see the module
    docstring)."""
    state, last, cursor = meta[0], int(meta[4]), int(meta[6])
    if state is None and last == 0:
        return meta  # no such conversation: its tail is already the empty one
    if cursor < hint:
        return None
    run_encoding, run_from = meta[2]
    if run_encoding is None or text(run_encoding) != encoding:
        return None  # counts under another encoding: the script reads them beside the log
    start = int(run_from) if run_from is not None else None
    flat: list[Any] = []
    whole = len(page) < TAIL_PAGE
    # Newest first: keep the entries after the cursor, oldest first in the result.
    for entry_id, fields in reversed(page):
        seq = int(as_bytes(entry_id).split(b"-", 1)[0])
        if seq <= cursor:
            whole = True  # the page reaches past the cursor: it holds the whole tail
            continue
        # Counts of the run only (an entry before it may hold an earlier run's count).
        count = _field(fields, b"t") if start is not None and seq >= start else None
        flat += (seq, _field(fields, b"m"), count if count is not None else "")
    if not whole:
        return None
    return [*meta[:2], [0, 0, 0, flat, []], *meta[3:]]


def _field(fields: dict[Any, Any] | list[Any], name: bytes) -> Any:
    # A pipeline applies XREVRANGE's reply callback (a dict per entry); a cluster
    # transaction returns the raw reply (a flat field list). Either decoding, bytes or str.
    if isinstance(fields, list):
        for i in range(0, len(fields) - 1, 2):
            if as_bytes(fields[i]) == name:
                return fields[i + 1]
        return None
    found = fields.get(name)
    return found if found is not None else fields.get(name.decode())


def _index_bytes(value: Any) -> bytes | None:
    # Stored base64 (a client with decode_responses=True must be able to read it back).
    return base64.b64decode(as_bytes(value)) if value is not None else None
