"""``RedisStateStore``: compaction states in Redis (the key layout: ``ctxcore.state.redis``)."""

from __future__ import annotations

import base64
from typing import Any

import redis

from ctxcore.state.archive import ArchiveChunk, ArchiveWrite, decode_chunk, encode_chunk
from ctxcore.state.base import (
    HISTORY_LIMIT,
    MessageLog,
    encode_state,
    loaded_cursor,
    newest_state,
    rollback_by_save,
)
from ctxcore.state.budget import check_budget
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.redis.common import RedisBackend as _RedisBackend
from ctxcore.state.redis.common import text, translated
from ctxcore.state.redis.log import RedisMessageLog
from ctxcore.state.redis.retention import RedisRetention
from ctxcore.state.redis.save_scripts import SAVE_ARCHIVE_LUA, SAVE_LUA
from ctxcore.state.redis.window import RedisWindowReader
from ctxcore.state.retention import Retention
from ctxcore.state.window_read import WindowReader

__all__ = ["RedisStateStore"]


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

    load = newest_state

    def cursor(self, key: ConversationKey) -> str | None:
        """The cursor from the head the saves write (``cursor|pinned|archive version``): a few
        bytes instead of the state's JSON (10.7 kB in bench/fast_path.py, 63 us to decode), in
        one round trip; a state saved before heads existed is loaded instead."""
        pipe = self._client.pipeline(transaction=False)
        pipe.get(self._key(key, "state:head"))
        pipe.exists(self._key(key, "state:history"))
        with translated(f"cursor {key}"):
            head, saved = pipe.execute()
        if head is not None:
            return text(head).split("|", 1)[0] or None
        return loaded_cursor(self, key) if saved else None

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

    rollback = rollback_by_save

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
        budget_tokens = check_budget(budget_tokens)
        name, ttl = self._key(key, "budget"), self._retention.ttl_ms(key)
        with translated(f"set_budget {key}"):
            if ttl == 0:
                self._client.set(name, budget_tokens)
                return
            # A plain SET drops any TTL: the budget gets the conversation's expiry instead.
            self._retention.set(key, name, budget_tokens)
        # A window is activity: the conversation's expiry is refreshed when due.
        self._retention.touch(key)

    def window_reader(self, log: MessageLog) -> WindowReader | None:
        """A ``RedisWindowReader`` when ``log`` is the ``RedisMessageLog`` of this client and prefix."""
        if not (isinstance(log, RedisMessageLog) and log.client is self.client and log.prefix == self.prefix):
            return None
        return RedisWindowReader(log.client, log.prefix, log.retention, log.decoded)
