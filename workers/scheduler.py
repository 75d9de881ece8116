"""Fair, coalescing compaction queue in Redis.

Celery queues are FIFO, so a tenant that enqueues 10,000 jobs would starve everyone behind
it. Here jobs wait in one Redis list per tenant, and a ring of tenants with waiting jobs is
served round-robin: each Celery ``ctxcore.drain`` message is only a token meaning "run the
next job, fairly", so the order in which jobs *start* is decided by the ring, not by the
order the tokens were sent.

Per conversation there is at most one queued job and one running job: a request while
queued is absorbed; a request while running marks it dirty, and exactly one follow-up is
queued when the run finishes. A running job holds a lease; if its worker dies the lease
runs out and the next request re-queues the conversation.

All keys share the hash tag ``{<prefix>:sched}`` so the Lua scripts stay in one slot on
Redis Cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import redis

from ctxcore.errors import StoreUnavailable
from ctxcore.state.keys import ConversationKey

__all__ = ["FairScheduler", "Job", "Status"]

Status = Literal["idle", "queued", "running"]

_ENQUEUE = """
local status, inring, ring = KEYS[1], KEYS[2], KEYS[3]
local member, tenant, conv, now, qprefix = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local st = redis.call('HGET', status, member)
if st then
  local kind, deadline = string.match(st, '^(%a+):?(%d*%.?%d*)$')
  if kind == 'queued' then return 0 end
  if tonumber(deadline) and tonumber(deadline) > now then
    redis.call('HSET', status, member, 'dirty:' .. deadline)
    return 0
  end
end
redis.call('HSET', status, member, 'queued')
redis.call('RPUSH', qprefix .. tenant, conv)
if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
return 1
"""

_NEXT = """
local status, inring, ring = KEYS[1], KEYS[2], KEYS[3]
local now, lease, qprefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for _ = 1, 1000 do
  local tenant = redis.call('LPOP', ring)
  if not tenant then return nil end
  local q = qprefix .. tenant
  local conv = redis.call('LPOP', q)
  if redis.call('LLEN', q) > 0 then redis.call('RPUSH', ring, tenant) else redis.call('SREM', inring, tenant) end
  if conv then
    redis.call('HSET', status, tenant .. '/' .. conv, 'running:' .. (now + lease))
    return {tenant, conv}
  end
end
return nil
"""

_RENEW = """
local st = redis.call('HGET', KEYS[1], ARGV[1])
if not st then return 0 end
local kind = string.match(st, '^(%a+)')
if kind == 'running' or kind == 'dirty' then
  redis.call('HSET', KEYS[1], ARGV[1], kind .. ':' .. ARGV[2])
  return 1
end
return 0
"""

_FINISH = """
local status, inring, ring = KEYS[1], KEYS[2], KEYS[3]
local member, tenant, conv, qprefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local st = redis.call('HGET', status, member)
if st and string.match(st, '^dirty') then
  redis.call('HSET', status, member, 'queued')
  redis.call('RPUSH', qprefix .. tenant, conv)
  if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
  return 1
end
if st and string.match(st, '^running') then redis.call('HDEL', status, member) end
return 0
"""


@dataclass(frozen=True)
class Job:
    """A conversation whose compaction is due."""

    key: ConversationKey


class FairScheduler:
    """Round-robin per-tenant job queue with per-conversation coalescing (see module doc)."""

    def __init__(self, client: redis.Redis, prefix: str = "ctxcore", lease_seconds: float = 300.0) -> None:
        self.client = client
        tag = f"{{{prefix}:sched}}"
        self._status = f"{tag}:status"
        self._inring = f"{tag}:inring"
        self._ring = f"{tag}:ring"
        self._qprefix = f"{tag}:q:"
        self.lease_seconds = lease_seconds
        self._enqueue = client.register_script(_ENQUEUE)
        self._next = client.register_script(_NEXT)
        self._renew = client.register_script(_RENEW)
        self._finish = client.register_script(_FINISH)

    @staticmethod
    def _member(key: ConversationKey) -> str:
        return f"{key.tenant_id}/{key.conversation_id}"

    def _keys(self) -> list[str]:
        return [self._status, self._inring, self._ring]

    def request(self, key: ConversationKey) -> bool:
        """Ask for a compaction of ``key``; True if a new job was queued (send one drain token)."""
        try:
            return bool(
                self._enqueue(
                    keys=self._keys(),
                    args=[self._member(key), key.tenant_id, key.conversation_id, time.time(), self._qprefix],
                )
            )
        except redis.RedisError as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc

    def next_job(self) -> Job | None:
        """Pop the next job, round-robin over tenants, and mark it running under a lease."""
        try:
            got = self._next(keys=self._keys(), args=[time.time(), self.lease_seconds, self._qprefix])
        except redis.RedisError as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc
        if not got:
            return None
        tenant, conv = (v.decode() if isinstance(v, bytes) else str(v) for v in got)
        return Job(ConversationKey(tenant, conv))

    def renew(self, key: ConversationKey) -> bool:
        """Extend a running job's lease (called by each stage)."""
        return bool(
            self._renew(keys=[self._status], args=[self._member(key), time.time() + self.lease_seconds])
        )

    def finish(self, key: ConversationKey) -> bool:
        """Mark a run finished; True if a follow-up was queued (send one drain token)."""
        return bool(
            self._finish(
                keys=self._keys(), args=[self._member(key), key.tenant_id, key.conversation_id, self._qprefix]
            )
        )

    def status(self, key: ConversationKey) -> Status:
        """``idle``, ``queued`` or ``running`` (a dirty run counts as running)."""
        try:
            raw = self.client.hget(self._status, self._member(key))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc
        if raw is None:
            return "idle"
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        if text.startswith("queued"):
            return "queued"
        deadline = text.split(":", 1)[1] if ":" in text else ""
        if deadline and float(deadline) < time.time():
            return "idle"  # the lease ran out: the worker died
        return "running"

    def forget(self, key: ConversationKey) -> None:
        """Drop a conversation's queued work and status (on delete)."""
        pipe = self.client.pipeline()
        pipe.hdel(self._status, self._member(key))
        pipe.lrem(self._qprefix + key.tenant_id, 0, key.conversation_id)
        pipe.execute()

    def depth(self) -> int:
        """Jobs waiting in all tenant queues."""
        tenants = [
            t.decode() if isinstance(t, bytes) else str(t) for t in self.client.lrange(self._ring, 0, -1)
        ]
        if not tenants:
            return 0
        pipe = self.client.pipeline()
        for tenant in tenants:
            pipe.llen(self._qprefix + tenant)
        return int(sum(pipe.execute()))
