"""The fair scheduler's Lua scripts (see ``workers.scheduler``).

Every key a script touches arrives in ``KEYS``, and all of them are one ring's keys, so each
call is one cluster slot. Statuses are ``queued:<t>``, ``running:<lease deadline>`` or
``dirty:<lease deadline>`` (running, and asked for again meanwhile).

Ring keys, in this order where a script takes them all: ``status`` (hash member -> status),
``inring`` (set of tenants in the ring), ``ring`` (list of tenants, round-robin), ``q`` (the
named tenant's queue of conversations), ``out`` (drain tokens outstanding for the ring),
``stamp`` (when a token of the ring was last sent or consumed) and ``seq`` (a counter bumped
by every status change), then ``beat`` (hash member -> the time after which a running job
with no news is lost: a running stage's heartbeat, or a stage sent or waiting for its retry
countdown, pushes it on; ``workers.lost_jobs``). Scripts that change a status return the new
one ('' for idle) and the ring's new ``seq`` last (``seq`` 0: nothing changed), for ``MIRROR``.
"""

from __future__ import annotations

from ctxcore.state.redis.retention import EXPIRY_LUA

__all__ = ["BEAT", "ENQUEUE", "FINISH", "FORGET", "MIRROR", "POP", "RENEW", "REQUEUE_LOST", "ROTATE", "STUCK"]

# Queue the job unless it is queued or running (absorbed: 0; a running job is marked dirty).
# ARGV: member, tenant, conversation, now, stale seconds, ring tokens.
# Returns 0 absorbed; 1 queued, send a token (counted in `out`); 3 queued, the ring has its
# tokens out already; 2 already queued but the ring's tokens are stale: send one more.
ENQUEUE = """
local status, inring, ring, q, out, stamp, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local member, tenant, conv, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local stale, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local last = tonumber(redis.call('GET', stamp) or '0')
local st = redis.call('HGET', status, member)
if st then
  local kind, deadline = string.match(st, '^(%a+):?(%d*%.?%d*)$')
  if kind == 'queued' then
    if last < now - stale then
      redis.call('SET', stamp, ARGV[4])
      return {2, '', 0}
    end
    return {0, '', 0}
  end
  if tonumber(deadline) and tonumber(deadline) > now then
    if kind == 'dirty' then return {0, '', 0} end
    redis.call('HSET', status, member, 'dirty:' .. deadline)
    return {0, 'dirty:' .. deadline, redis.call('INCR', seq)}
  end
end
redis.call('HSET', status, member, 'queued:' .. ARGV[4])
local changed = redis.call('INCR', seq)
redis.call('RPUSH', q, conv)
if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
local n = tonumber(redis.call('GET', out) or '0')
if n < limit or last < now - stale then
  if n < limit then redis.call('INCR', out) end
  redis.call('SET', stamp, ARGV[4])
  return {1, 'queued:' .. ARGV[4], changed}
end
return {3, 'queued:' .. ARGV[4], changed}
"""

# A drain token reaches the ring (ARGV[1] == '1': it is this ring's own token, counted in
# `out`; '0': a token scanning onward). Moves the head tenant to the tail and returns it.
# KEYS: ring, out, stamp. ARGV: consume, now.
ROTATE = """
if ARGV[1] == '1' then
  if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end
  redis.call('SET', KEYS[3], ARGV[2])
end
return redis.call('LMOVE', KEYS[1], KEYS[1], 'LEFT', 'RIGHT')
"""

# Start the named tenant's next job (ARGV: tenant, now, lease, ring tokens, liveness
# seconds). Re-checks the queue: an empty one takes the tenant out of the ring and returns
# nil. Returns {conversation, 1 when a token for the ring must be re-sent (it has more jobs)
# else 0, status, seq}.
POP = """
local status, inring, ring, q, out, stamp, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local tenant, now, lease, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local conv = redis.call('LPOP', q)
if redis.call('LLEN', q) == 0 then
  redis.call('SREM', inring, tenant)
  redis.call('LREM', ring, 0, tenant)
end
if not conv then return nil end
local running = 'running:' .. (now + lease)
redis.call('HSET', status, tenant .. '/' .. conv, running)
redis.call('HSET', KEYS[8], tenant .. '/' .. conv, now + tonumber(ARGV[5]))
local resend = 0
if redis.call('LLEN', ring) > 0 and tonumber(redis.call('GET', out) or '0') < limit then
  redis.call('INCR', out)
  redis.call('SET', stamp, ARGV[2])
  resend = 1
end
return {conv, resend, running, redis.call('INCR', seq)}
"""

# Extend a running job's lease. KEYS: status, seq. ARGV: member, new deadline.
RENEW = """
local st = redis.call('HGET', KEYS[1], ARGV[1])
if not st then return {0, '', 0} end
local kind = string.match(st, '^(%a+)')
if kind == 'running' or kind == 'dirty' then
  redis.call('HSET', KEYS[1], ARGV[1], kind .. ':' .. ARGV[2])
  return {1, kind .. ':' .. ARGV[2], redis.call('INCR', KEYS[2])}
end
return {0, '', 0}
"""

# End a run. ARGV: member, tenant, conversation, now, follow-up ('1'/'0'), ring tokens.
# Returns -1 not running (nothing finished); 0 finished; 1 finished and its follow-up queued
# with a token to send; 2 finished and its follow-up queued behind the ring's tokens.
FINISH = """
local status, inring, ring, q, out, stamp, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local member, tenant, conv, now, limit = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[6])
local st = redis.call('HGET', status, member)
if st and (string.match(st, '^running') or string.match(st, '^dirty')) then redis.call('HDEL', KEYS[8], member) end
if st and string.match(st, '^dirty') and ARGV[5] == '1' then
  redis.call('HSET', status, member, 'queued:' .. now)
  redis.call('RPUSH', q, conv)
  if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
  local changed = redis.call('INCR', seq)
  if tonumber(redis.call('GET', out) or '0') < limit then
    redis.call('INCR', out)
    redis.call('SET', stamp, now)
    return {1, 'queued:' .. now, changed}
  end
  return {2, 'queued:' .. now, changed}
end
if st and (string.match(st, '^running') or string.match(st, '^dirty')) then
  redis.call('HDEL', status, member)
  return {0, '', redis.call('INCR', seq)}
end
return {-1, '', 0}
"""

# Drop a conversation's queued job and status. KEYS: status, inring, ring, q, seq, beat.
# ARGV: member, tenant, conversation.
FORGET = """
local status, inring, ring, q = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
redis.call('HDEL', status, ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('LREM', q, 0, ARGV[3])
if redis.call('LLEN', q) == 0 and redis.call('SREM', inring, ARGV[2]) == 1 then
  redis.call('LREM', ring, 0, ARGV[2])
end
return {1, '', redis.call('INCR', KEYS[5])}
"""

# The status mirrored into the conversation's compaction hash (KEYS[1], the conversation's
# slot: the fast path reads it with the failure record in one call). ARGV: status ('' for
# idle), the ring's seq, the retention in ms (0: none; else the hash gets the conversation's
# expiry, that of its log counter, KEYS[2]); an older seq than the stored one (a late writer)
# changes nothing, and idle on a missing hash (a deleted conversation) creates none.
MIRROR = (
    EXPIRY_LUA
    + """
if ARGV[1] == '' and redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if tonumber(ARGV[2]) <= tonumber(redis.call('HGET', KEYS[1], 'sched_seq') or '0') then return 0 end
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'sched') else redis.call('HSET', KEYS[1], 'sched', ARGV[1]) end
redis.call('HSET', KEYS[1], 'sched_seq', ARGV[2])
local ttl = tonumber(ARGV[3] or '0')
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], expiry_of(KEYS[2], ttl))
end
return 1
"""
)

# The reconciler, per ring: a ring with jobs whose tokens were neither sent nor consumed for
# ARGV[2] seconds lost them. Re-stamps the ring and returns {1, 0}: send one token (`out`
# restarts from it; the drain it starts re-sends it while the ring has jobs, and new jobs add
# up to the ring's allowance). Any other ring returns {0, its outstanding tokens}: the
# reconciler tells them from the stuck rings' in the jobs queue.
# KEYS: ring, out, stamp. ARGV: now, stale seconds.
STUCK = """
local out = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('LLEN', KEYS[1]) == 0 then return {0, out} end
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
if last >= tonumber(ARGV[1]) - tonumber(ARGV[2]) then return {0, out} end
redis.call('SET', KEYS[3], ARGV[1])
redis.call('SET', KEYS[2], 1)
return {1, 0}
"""

# A running job shows life until ARGV[2] (a heartbeat of its running stage, or a stage sent
# or waiting for its retry countdown). KEYS: status, beat. ARGV: member, deadline. Returns 1,
# or 0 when the job is not running (finished, re-queued, forgotten): nothing is written.
BEAT = """
local st = redis.call('HGET', KEYS[1], ARGV[1])
if not st then return 0 end
local kind = string.match(st, '^(%a+)')
if kind ~= 'running' and kind ~= 'dirty' then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# Re-queue a running job whose beat deadline passed (its stage was lost), re-checked here:
# queued again at the tail of its tenant's queue, its beat dropped. Same KEYS as ENQUEUE
# plus beat. ARGV: member, tenant, conversation, now, ring tokens. Returns {0, '', 0} when
# the job showed life meanwhile or is not running; else {1, status, seq} with a token to
# send (counted in `out`), or {3, status, seq} when the ring has its tokens out already.
REQUEUE_LOST = """
local status, inring, ring, q, out, stamp, seq, beat = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local member, tenant, conv, now, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local deadline = tonumber(redis.call('HGET', beat, member) or '')
if not deadline or deadline >= now then return {0, '', 0} end
local st = redis.call('HGET', status, member)
local kind = st and string.match(st, '^(%a+)')
redis.call('HDEL', beat, member)
if kind ~= 'running' and kind ~= 'dirty' then return {0, '', 0} end
redis.call('HSET', status, member, 'queued:' .. ARGV[4])
local changed = redis.call('INCR', seq)
redis.call('RPUSH', q, conv)
if redis.call('SADD', inring, tenant) == 1 then redis.call('RPUSH', ring, tenant) end
if tonumber(redis.call('GET', out) or '0') < limit then
  redis.call('INCR', out)
  redis.call('SET', stamp, ARGV[4])
  return {1, 'queued:' .. ARGV[4], changed}
end
return {3, 'queued:' .. ARGV[4], changed}
"""
