"""Per-tenant token-bucket rate limiting shared by every API process through Redis.

One bucket per tenant, kept in a Redis hash (``tokens``, ``ts``) and updated by one Lua
script, so the check-and-take is atomic however many API processes serve the tenant. The
script reads the clock with Redis ``TIME``: API hosts with skewed clocks still agree.
Buckets expire once they would be full again, so idle tenants cost no memory.

Each tenant's bucket is its own hash tag, ``{<prefix>:rate:<tenant>}``: on Redis Cluster the
tenants spread over the masters instead of sharing one slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from ctxcore.errors import StoreUnavailable
from ctxcore.state.redis_common import UNAVAILABLE

__all__ = ["RateDecision", "RateLimiter"]

# KEYS[1]: the tenant's bucket. ARGV: rate (tokens per second), burst (capacity), cost.
# Returns {allowed (0/1), seconds to wait until `cost` tokens are available (as a string:
# Lua numbers returned to Redis are truncated to integers)}.
_TAKE = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local saved = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(saved[1]), tonumber(saved[2])
if tokens == nil or ts == nil then
  tokens, ts = burst, now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
end
local allowed, wait = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
-- Expire once full again (an absent bucket is a full one); capped at a day so a tiny rate
-- never produces a number Lua would print in exponent notation.
redis.call('PEXPIRE', KEYS[1], math.min(math.ceil(burst / rate * 1000) + 1000, 86400000))
return {allowed, tostring(wait)}
"""


@dataclass(frozen=True)
class RateDecision:
    """The outcome of one ``RateLimiter.take``."""

    allowed: bool
    wait_seconds: float

    @property
    def retry_after(self) -> int:
        """Whole seconds for a ``Retry-After`` header (at least 1: 0 would invite a hot retry loop)."""
        return max(1, math.ceil(self.wait_seconds))


class RateLimiter:
    """Token buckets per tenant in Redis (see module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str = "ctxcore") -> None:
        self.client = client
        self._prefix = prefix
        self._take = client.register_script(_TAKE)

    def key(self, tenant_id: str) -> str:
        """The Redis key of ``tenant_id``'s bucket."""
        return f"{{{self._prefix}:rate:{tenant_id}}}"

    def take(self, tenant_id: str, rate: float, burst: int, cost: int = 1) -> RateDecision:
        """Take ``cost`` tokens from the tenant's bucket if it holds them.

        ``rate`` tokens flow in per second up to ``burst``. Raises ``StoreUnavailable``
        when Redis cannot be reached.
        """
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate and burst must be positive, got rate={rate!r} burst={burst!r}")
        try:
            allowed, wait = self._take(keys=[self.key(tenant_id)], args=[repr(float(rate)), burst, cost])
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"rate limiter unavailable: {exc}") from exc
        text = wait.decode() if isinstance(wait, bytes) else str(wait)
        return RateDecision(allowed=bool(int(allowed)), wait_seconds=float(text))
