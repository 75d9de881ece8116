"""``RedisMessageLog``: conversations' logs as Redis streams (the layout: ``ctxcore.state.redis``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from ctxcore.messages import AnyMessage
from ctxcore.state.base import (
    LogOverview,
    append_conflict,
    check_loggable,
    encode_log_message,
    expected_seq,
    format_log_id,
    message_by_id,
    parse_log_id,
    truncate_moved,
)
from ctxcore.state.decoded import DecodedEntries, decoded_rows
from ctxcore.state.keys import ConversationKey, listing_wanted
from ctxcore.state.redis.common import RedisBackend as _RedisBackend
from ctxcore.state.redis.common import as_bytes, field, text, translated
from ctxcore.state.redis.log_scripts import APPEND_LUA, TRUNCATE_LUA
from ctxcore.state.redis.retention import (
    RETAINED_SUFFIXES,
    RedisRetention,
    tenant_activity_key,
    tenant_index_key,
)
from ctxcore.state.redis.tail import RedisCountedLog
from ctxcore.state.retention import Retention
from ctxcore.state.tail import AppendCounts, CountedLog

__all__ = ["RedisMessageLog"]


class RedisMessageLog(_RedisBackend):
    """Append-only logs as Redis streams; ids come from a counter INCR-ed in the append script.

    Appends without a ``message_id`` are not idempotent: if a connection drops after Redis
    ran the script, a retry appends again. Give messages a ``message_id`` to make retries safe.

    With ``retention`` each append gives every key of the conversation the tenant's full TTL
    inside the append script and scores it in the tenant's activity set (same round trip).
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "ctxcore", retention: Retention | None = None
    ) -> None:
        super().__init__(client, prefix)
        self._append = client.register_script(APPEND_LUA)
        self._truncate = client.register_script(TRUNCATE_LUA)
        self._retention = RedisRetention(client, prefix, retention)
        # Appends validate against the newest entries and windows read the same page again:
        # each entry is decoded once per process (shared with this log's window reader).
        self.decoded = DecodedEntries()
        self._counted = RedisCountedLog(client, self._retention, self.decoded, self._append_with)

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "ctxcore", retention: Retention | None = None, **client_kwargs: Any
    ) -> RedisMessageLog:
        """A log on a new client for ``url``; extra kwargs go to ``redis.Redis.from_url``."""
        return cls(redis.Redis.from_url(url, **client_kwargs), prefix=prefix, retention=retention)

    @property
    def retention(self) -> RedisRetention:
        """The conversations' expiry on this client and prefix (windows refresh through it)."""
        return self._retention

    def counted(self) -> CountedLog:
        """Its ``CountedLog``: appends storing counts, newest-first tails (``RedisCountedLog``)."""
        return self._counted

    def _keys(self, key: ConversationKey) -> tuple[str, str, str, str, str, str]:
        return (
            self._key(key, "log:seq"),
            self._key(key, "log"),
            self._key(key, "log:dedupe"),
            self._key(key, "log:end"),
            self._key(key, "log:run"),
            self._key(key, "log:real"),
        )

    def _index(self, tenant_id: str) -> str:
        return tenant_index_key(self.prefix, tenant_id)

    def _listing(self, pipe: Any, key: ConversationKey, ttl: int) -> None:
        """Queue the listing's writes (the tenant's slot): listed, and scored active."""
        pipe.zadd(self._index(key.tenant_id), {key.conversation_id: 0}, nx=True)
        if ttl:
            pipe.zadd(
                tenant_activity_key(self.prefix, key.tenant_id), {key.conversation_id: self._retention.now()}
            )

    def append(
        self, key: ConversationKey, messages: Sequence[AnyMessage], *, expected_last_id: str | None = None
    ) -> list[str]:
        """Append ``messages`` atomically; a known ``message_id`` gets its existing log id back.

        ``expected_last_id`` is checked inside the append script (``ConflictError``).
        """
        return self._append_with(key, messages, expected_last_id, None)

    def _append_with(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        expected_last_id: str | None,
        counts: AppendCounts | None,
    ) -> list[str]:
        check_loggable(messages)
        expected = expected_seq(expected_last_id)
        if not messages:
            return []
        ttl = self._retention.ttl_ms(key)
        args: list[str] = [
            "" if expected is None else str(expected),
            counts.encoding if counts else "",
            str(ttl),
        ]
        for i, message in enumerate(messages):
            args += [message.message_id or "", encode_log_message(message)]
            args += [str(int(counts.counts[i])), "1" if counts.real[i] else ""] if counts else ["", ""]
        keys = list(self._keys(key))
        if ttl:
            # The script refreshes the whole conversation: its other keys ride along (the
            # log's six keys are RETAINED_SUFFIXES' first six, in that order).
            keys += self._retention.refreshed_keys(key, skip=RETAINED_SUFFIXES[: len(keys)])
        with translated(f"append to {key}"):
            if isinstance(self._client, RedisCluster):
                # Two slots, two calls: the listing first (idempotent), then the log.
                listing = self._client.pipeline(transaction=False)
                self._listing(listing, key, ttl)
                listing.execute()
                ids = self._append(keys=keys, args=args)
                return self._appended(key, expected_last_id, ids)
            # Listing first (idempotent), then the log, in one round trip. The listing lives
            # in another cluster slot, so it cannot be inside the script.
            for attempt in range(2):
                pipe = self._client.pipeline(transaction=False)
                self._listing(pipe, key, ttl)
                pipe.evalsha(self._append.sha, len(keys), *keys, *args)
                *listed, ids = pipe.execute(raise_on_error=False)
                if isinstance(ids, NoScriptError) and attempt == 0:
                    self._client.script_load(APPEND_LUA)  # e.g. after a server restart
                    continue
                for result in (*listed, ids):
                    if isinstance(result, Exception):
                        raise result
                break
        return self._appended(key, expected_last_id, ids)

    @staticmethod
    def _appended(key: ConversationKey, expected_last_id: str | None, ids: Any) -> list[str]:
        out = [text(i) for i in ids]
        if out and out[0] == "!conflict":
            raise append_conflict(key, expected_last_id, int(out[1]))
        return out

    def _xrange(self, key: ConversationKey, start: str, end: str, count: int | None) -> list[AnyMessage]:
        with translated(f"read {key}"):
            entries: list[tuple[bytes | str, dict[Any, Any]]] = self._client.xrange(  # type: ignore[assignment]
                self._key(key, "log"), start, end, count=count
            )
        # Entry "n-0" holds the message with log id n.
        rows = [
            (int(text(entry_id).partition("-")[0]), as_bytes(field(fields, "m")))
            for entry_id, fields in entries
        ]
        return self.decoded.decode(rows, decoded_rows)

    def read_after(
        self, key: ConversationKey, cursor: str | None, limit: int | None = None
    ) -> list[AnyMessage]:
        """Messages after ``cursor`` (from the start when None), oldest first."""
        start = f"{parse_log_id(cursor) + 1}-0" if cursor is not None else "-"
        if limit is not None and limit < 1:
            return []
        return self._xrange(key, start, "+", limit)

    def read_newest(self, key: ConversationKey, cursor: str | None, limit: int) -> list[AnyMessage]:
        """The newest ``limit`` messages after ``cursor``, oldest first (one ``XREVRANGE``)."""
        if limit < 1:
            return []
        stop = f"{parse_log_id(cursor) + 1}-0" if cursor is not None else "-"
        with translated(f"read {key}"):
            entries: list[tuple[bytes | str, dict[Any, Any]]] = self._client.xrevrange(  # type: ignore[assignment]
                self._key(key, "log"), "+", stop, count=limit
            )
        rows = [
            (int(text(entry_id).partition("-")[0]), as_bytes(field(fields, "m")))
            for entry_id, fields in reversed(entries)
        ]
        return self.decoded.decode(rows, decoded_rows)

    def read_range(self, key: ConversationKey, first: str, last: str) -> list[AnyMessage]:
        """Messages with ``first <= log id <= last``."""
        start, stop = parse_log_id(first), parse_log_id(last)
        if stop < start:
            return []
        return self._xrange(key, f"{start}-0", f"{stop}-0", None)

    get = message_by_id

    def last_id(self, key: ConversationKey) -> str | None:
        """The newest log id, or None."""
        with translated(f"last_id {key}"):
            seq, end = self._client.mget(self._key(key, "log:seq"), self._key(key, "log:end"))
        value = end if end is not None else seq
        return format_log_id(int(value)) if value is not None and int(value) > 0 else None

    def overview(self, key: ConversationKey) -> LogOverview:
        """The run hash's total when the run starts at the first entry, and the tenant's
        activity score (kept with a retention): one pipelined round trip, no entry read."""
        with translated(f"overview of {key}"):
            pipe = self._client.pipeline(transaction=False)
            pipe.hmget(self._key(key, "log:run"), ["enc", "from", "total"])
            pipe.xlen(self._key(key, "log"))
            pipe.zscore(tenant_activity_key(self._retention.prefix, key.tenant_id), key.conversation_id)
            (enc, start, total), length, active = pipe.execute()
        encoding = enc.decode() if isinstance(enc, bytes) else enc
        if not length:
            tokens: int | None = 0
        else:  # ids start at 1 and only the newest are ever removed: from 1 is the whole log
            tokens = int(total) if start is not None and int(start) <= 1 and total is not None else None
        return LogOverview(tokens, encoding, float(active) if active is not None else None)

    def delete(self, key: ConversationKey) -> None:
        """Remove the log, its counter and dedupe index, then unlist the conversation."""
        with translated(f"delete {key}"):
            self._client.delete(*self._keys(key), self._key(key, "log:other"))
            self._client.zrem(self._index(key.tenant_id), key.conversation_id)
            if self._retention.ttl_ms(key):
                self._client.zrem(tenant_activity_key(self.prefix, key.tenant_id), key.conversation_id)

    def truncate_after(
        self, key: ConversationKey, log_id: str, *, expected_last_id: str | None = None
    ) -> list[str]:
        """Remove the messages above ``log_id`` in one script (see ``MessageLog.truncate_after``)."""
        after = parse_log_id(log_id)
        expected = "" if expected_last_id is None else str(expected_seq(expected_last_id))
        with translated(f"truncate {key}"):
            out = [
                text(i)
                for i in self._truncate(
                    keys=list(self._keys(key)), args=[after, expected, self._retention.ttl_ms(key)]
                )
            ]
        if out and out[0] == "!conflict":
            raise truncate_moved(key, str(expected_last_id), int(out[1]))
        return out

    def list_conversations(self, tenant_id: str, after: str | None = None, limit: int = 100) -> list[str]:
        """A page of the tenant's conversation ids, in id order."""
        if not listing_wanted(tenant_id, after, limit):
            return []
        with translated(f"list conversations of {tenant_id}"):
            ids: list[bytes | str] = self._client.zrange(  # type: ignore[assignment]
                self._index(tenant_id), f"({after}" if after else "-", "+", bylex=True, offset=0, num=limit
            )
        return [text(i) for i in ids]
