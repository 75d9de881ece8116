"""``RedisStageJournal``: a conversation's stage journal as one Redis list under its hash tag."""

from __future__ import annotations

import redis

from ctxcore.state.journal import JOURNAL_LIMIT, JournalEntry
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.common import RedisBackend, translated
from ctxcore.state.redis.retention import EXPIRY_LUA, RedisRetention
from ctxcore.state.retention import Retention

__all__ = ["APPEND_LUA", "JOURNAL_SUFFIX", "RedisStageJournal"]

JOURNAL_SUFFIX = "journal"

# KEYS: the journal list, the log counter. ARGV: entry JSON, entries kept, retention ms (0:
# none). Newest first; with a retention the list gets the conversation's expiry.
APPEND_LUA = (
    EXPIRY_LUA
    + """
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], expiry_of(KEYS[2], ttl))
end
return 1
"""
)


class RedisStageJournal(RedisBackend):
    """``<prefix>:{<tenant>:<conversation>}:journal``: a list, newest entry first, trimmed
    to ``limit`` in the same script as each push (one slot with the rest of the conversation)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        retention: Retention | None = None,
        limit: int = JOURNAL_LIMIT,
    ) -> None:
        super().__init__(client, prefix)
        self.limit = limit
        self._retention = RedisRetention(client, prefix, retention)
        self._append = client.register_script(APPEND_LUA)

    def append(self, key: ConversationKey, entry: JournalEntry) -> None:
        """Add ``entry`` as the newest; the list keeps ``limit`` entries."""
        keys = [self._key(key, JOURNAL_SUFFIX), self._key(key, "log:seq")]
        with translated(f"journal of {key}"):
            self._append(keys=keys, args=[entry.to_json(), self.limit, self._retention.ttl_ms(key)])

    def entries(self, key: ConversationKey, limit: int = JOURNAL_LIMIT) -> list[JournalEntry]:
        """Up to ``limit`` entries, newest first."""
        if limit <= 0:
            return []
        with translated(f"read journal of {key}"):
            raw: list[bytes | str] = self.client.lrange(self._key(key, JOURNAL_SUFFIX), 0, limit - 1)
        return [JournalEntry.from_json(item) for item in raw]

    def delete(self, key: ConversationKey) -> None:
        """Forget the conversation's journal."""
        with translated(f"delete journal of {key}"):
            self.client.delete(self._key(key, JOURNAL_SUFFIX))
