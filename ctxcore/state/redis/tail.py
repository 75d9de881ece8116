"""Stored counts and newest-first tails on Redis (``RedisMessageLog.counted()``).

Keys beside the log, in the conversation's slot: ``...:log:run`` (hash: the counted run's
enc, from and total), ``...:log:real`` (sorted set of the run's real-user seqs) and
``...:log:other`` (hash ``encoding:seq -> count`` for encodings other than the run's: one
hash for all of them, so deleting a conversation needs no listing). Each counted stream
entry also holds ``t`` (its count) and ``c`` (the run's total through it); see
``READ_TAIL_LUA`` for the read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from ctxcore.messages import AnyMessage
from ctxcore.state.base import format_log_id, parse_log_id
from ctxcore.state.decoded import DecodedEntries, decoded_rows
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.common import as_bytes, translated
from ctxcore.state.redis.log_scripts import READ_TAIL_LUA
from ctxcore.state.redis.retention import RedisRetention
from ctxcore.state.tail import TAIL_PAGE, AppendCounts, TailRead, check_counts

__all__ = ["RedisCountedLog", "decode_rows"]


def decode_rows(flat: Sequence[Any], cache: DecodedEntries) -> tuple[list[AnyMessage], list[int | None]]:
    """Messages and counts from the scripts' flat (seq, JSON, count or '') triples; entries
    ``cache`` decoded in an earlier read are reused."""
    rows = [(int(flat[i]), as_bytes(flat[i + 1])) for i in range(0, len(flat), 3)]
    counts = [int(c) if c != b"" and c != "" else None for c in flat[2::3]]
    return cache.decode(rows, decoded_rows), counts


class RedisCountedLog:
    """The ``CountedLog`` of a ``RedisMessageLog`` (its ``counted()``): the log's client,
    retention (which names the conversation's keys), decoded entries and counting append."""

    def __init__(
        self,
        client: redis.Redis,
        retention: RedisRetention,
        decoded: DecodedEntries,
        append: Callable[[ConversationKey, Sequence[AnyMessage], str | None, AppendCounts], list[str]],
    ) -> None:
        self._client = client
        self._retention = retention
        self._decoded = decoded
        self._append = append
        self._read_tail = client.register_script(READ_TAIL_LUA)

    def append_counted(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        counts: AppendCounts,
        *,
        expected_last_id: str | None = None,
    ) -> list[str]:
        """``append`` storing counts, the running total and real-user seqs in the same script."""
        return self._append(key, messages, expected_last_id, check_counts(messages, counts))

    def read_tail(
        self, key: ConversationKey, cursor: str | None, *, budget_tokens: int, encoding: str
    ) -> TailRead:
        """The newest entries after ``cursor`` filling ``budget_tokens``: one script call."""
        after = parse_log_id(cursor) if cursor is not None else 0
        keys = [self._retention.name(key, s) for s in ("log", "log:run", "log:real", "log:other")]
        with translated(f"read tail of {key}"):
            first, last, omitted, entries, anchors = self._read_tail(
                keys=keys, args=[after, TAIL_PAGE, budget_tokens, encoding]
            )
        messages, counts = decode_rows(entries, self._decoded)
        extra, _ = decode_rows(anchors, self._decoded)
        return TailRead(
            messages=messages,
            counts=counts,
            omitted=(format_log_id(int(first)), format_log_id(int(last))) if int(first) else None,
            omitted_tokens=int(omitted),
            anchors=extra,
        )

    def store_counts(self, key: ConversationKey, encoding: str, counts: Mapping[str, int]) -> None:
        """Keep counts under ``encoding`` (one HSET into the slot's other-encodings hash)."""
        if not counts:
            return
        mapping: dict[Any, Any] = {f"{encoding}:{parse_log_id(i)}": int(c) for i, c in counts.items()}
        name, ttl = self._retention.name(key, "log:other"), self._retention.ttl_ms(key)
        with translated(f"store counts of {key}"):
            if ttl == 0:
                self._client.hset(name, mapping=mapping)
                return
            # A new hash gets the conversation's expiry: counts outliving the log would be
            # read for a later conversation of the same id.
            self._retention.hash_write(key, name, put=mapping)
