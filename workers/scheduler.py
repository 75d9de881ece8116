"""Fair, coalescing compaction queue in Redis.

Celery queues are FIFO, so a tenant that enqueues 10,000 jobs would starve everyone behind
it. Here jobs wait in one Redis list per tenant, and a ring of tenants with waiting jobs is
served round-robin: each Celery ``ctxcore.drain`` message is only a token meaning "run the
next job, fairly", so the order in which jobs *start* is decided by the ring, not by the
order the tokens were sent.

Per conversation there is at most one queued job and one running job: a request while
queued is absorbed; a request while running marks it dirty, and exactly one follow-up is
queued when the run finishes (unless the run failed: the failure backoff decides when the
conversation may queue again). A running job holds a lease; if its worker dies the lease
runs out and the next request re-queues the conversation.

Liveness: a queued job is only started by a drain token, and a token can be lost (a failed
send, a consumer that died or misbehaved). The sorted set ``tokens`` scores each queued job
by when its last token was sent; ``stuck_jobs`` (the reconciler in every worker) takes the
jobs whose token is older than ``requeue_after_seconds``, re-scores them to now and returns
them, one new token each, atomically, so N workers send at most one token per stuck job per
interval; a request for such a job re-scores it and sends a token at once. A token that
finds the ring empty does nothing.

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

# Returns 1: a new job was queued; 2: the job was queued already but its last token is older
# than ARGV[6] seconds (re-scored: send another); 0: absorbed. Either of 1 and 2 asks the
# caller for one drain token.
_ENQUEUE = """
local status, inring, ring, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, tenant, conv, now, qprefix = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local stale = tonumber(ARGV[6])
local st = redis.call('HGET', status, member)
if st then
  local kind, deadline = string.match(st, '^(%a+):?(%d*%.?%d*)$')
  if kind == 'queued' then
    local sent = tonumber(redis.call('ZSCORE', tokens, member))
    if sent == nil or sent < now - stale then
      redis.call('ZADD', tokens, now, member)
      return 2
    end
    return 0
  end
  if tonumber(deadline) and tonumber(deadline) > now then
    redis.call('HSET', status, member, 'dirty:' .. deadline)
    return 0
  end
end
redis.call('HSET', status, member, 'queued:' .. ARGV[4])
redis.call('RPUSH', qprefix .. tenant, conv)
if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
redis.call('ZADD', tokens, now, member)
return 1
"""

_NEXT = """
local status, inring, ring, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, lease, qprefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for _ = 1, 1000 do
  local tenant = redis.call('LPOP', ring)
  if not tenant then return nil end
  local q = qprefix .. tenant
  local conv = redis.call('LPOP', q)
  if redis.call('LLEN', q) > 0 then redis.call('RPUSH', ring, tenant) else redis.call('SREM', inring, tenant) end
  if conv then
    local member = tenant .. '/' .. conv
    redis.call('HSET', status, member, 'running:' .. (now + lease))
    redis.call('ZREM', tokens, member)
    return {tenant, conv}
  end
end
return nil
"""

# Queued jobs whose last token was sent before ARGV[1]: re-scored to ARGV[2] and returned
# (at most ARGV[3]). Members that are no longer queued are dropped from the set.
_STUCK = """
local tokens, status = KEYS[1], KEYS[2]
local members = redis.call('ZRANGEBYSCORE', tokens, '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, member in ipairs(members) do
  local st = redis.call('HGET', status, member)
  if st and string.sub(st, 1, 6) == 'queued' then
    redis.call('ZADD', tokens, ARGV[2], member)
    table.insert(out, member)
  else
    redis.call('ZREM', tokens, member)
  end
end
return out
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

# Returns -1: the job was not running (nothing finished); 0: finished; 1: finished and
# its follow-up queued (send a drain token). ARGV[6] == '0' drops a dirty follow-up.
_FINISH = """
local status, inring, ring, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, tenant, conv, qprefix, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local st = redis.call('HGET', status, member)
if st and string.match(st, '^dirty') and ARGV[6] == '1' then
  redis.call('HSET', status, member, 'queued:' .. now)
  redis.call('RPUSH', qprefix .. tenant, conv)
  if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
  redis.call('ZADD', tokens, now, member)
  return 1
end
if st and (string.match(st, '^running') or string.match(st, '^dirty')) then
  redis.call('HDEL', status, member)
  return 0
end
return -1
"""


@dataclass(frozen=True)
class Job:
    """A conversation whose compaction is due."""

    key: ConversationKey


class FairScheduler:
    """Round-robin per-tenant job queue with per-conversation coalescing (see module doc)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        lease_seconds: float = 300.0,
        requeue_after_seconds: float = 30.0,
    ) -> None:
        self.client = client
        tag = f"{{{prefix}:sched}}"
        self._status = f"{tag}:status"
        self._inring = f"{tag}:inring"
        self._ring = f"{tag}:ring"
        self._qprefix = f"{tag}:q:"
        self._tokens = f"{tag}:tokens"
        self.lease_seconds = lease_seconds
        self.requeue_after_seconds = requeue_after_seconds
        self._enqueue = client.register_script(_ENQUEUE)
        self._next = client.register_script(_NEXT)
        self._renew = client.register_script(_RENEW)
        self._finish = client.register_script(_FINISH)
        self._stuck = client.register_script(_STUCK)

    @staticmethod
    def _member(key: ConversationKey) -> str:
        return f"{key.tenant_id}/{key.conversation_id}"

    def _keys(self) -> list[str]:
        return [self._status, self._inring, self._ring, self._tokens]

    def request(self, key: ConversationKey) -> bool:
        """Ask for a compaction of ``key``; True when a drain token must be sent: a new job
        was queued, or the queued job's last token is older than ``requeue_after_seconds``."""
        args = [self._member(key), key.tenant_id, key.conversation_id, repr(time.time()), self._qprefix]
        try:
            return bool(self._enqueue(keys=self._keys(), args=[*args, self.requeue_after_seconds]))
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
        try:
            return bool(
                self._renew(keys=[self._status], args=[self._member(key), time.time() + self.lease_seconds])
            )
        except redis.RedisError as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc

    def finish(self, key: ConversationKey, *, follow_up: bool = True) -> int:
        """Mark a run finished: -1 when it was not running (nothing to finish), 0 finished,
        1 finished and its follow-up queued (send one drain token). ``follow_up=False`` drops
        the follow-up a request during the run asked for (the run failed: back off)."""
        args = [self._member(key), key.tenant_id, key.conversation_id, self._qprefix, repr(time.time())]
        try:
            return int(self._finish(keys=self._keys(), args=[*args, "1" if follow_up else "0"]))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc

    def stuck_jobs(self, limit: int = 1000) -> list[ConversationKey]:
        """Queued jobs whose last drain token was sent over ``requeue_after_seconds`` ago,
        re-scored to now (send one token each); one atomic call, so concurrent reconcilers
        never both take the same job in one interval."""
        now = time.time()
        try:
            got = self._stuck(
                keys=[self._tokens, self._status],
                args=[repr(now - self.requeue_after_seconds), repr(now), limit],
            )
        except redis.RedisError as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc
        members = [m.decode() if isinstance(m, bytes) else str(m) for m in got or []]
        return [ConversationKey(*m.split("/", 1)) for m in members]

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
        pipe.zrem(self._tokens, self._member(key))
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
