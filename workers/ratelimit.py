"""Per-tenant token-bucket rate limiting shared by every API process through Redis.

One bucket per tenant, kept in a Redis hash (``tokens``, ``ts``) and updated by one Lua
script, so the check-and-take is atomic however many API processes serve the tenant. The
script reads the clock with Redis ``TIME``: API hosts with skewed clocks still agree.
Buckets expire once they would be full again, so idle tenants cost no memory.

Each tenant's bucket is its own hash tag, ``{<prefix>:rate:<tenant>}``: on Redis Cluster the
tenants spread over the masters instead of sharing one slot.

``admit`` is what the API's admission (``workers.admission``) asks before it reads a body:
in one script, the tenant's request token, its body bytes from a second pair of fields of
the same bucket (``bytes``, refilled at ``bytes_per_second``) and a place among its
requests in flight (a sorted set ``<bucket>:inflight`` of request ids by the time they are
presumed dead: a process that died holding one frees it then). Nothing is taken unless all
three allow; ``release`` gives the place back when the response is sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from ctxcore.errors import StoreUnavailable
from ctxcore.state.redis.common import UNAVAILABLE, text

__all__ = ["Admission", "RateDecision", "RateLimiter"]

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


# KEYS[1]: the tenant's bucket, KEYS[2]: its requests in flight. ARGV: request rate, burst,
# byte rate, byte burst, body bytes, max in flight, request id, hold ms. Returns {verdict
# ('ok', 'rate', 'bytes', 'concurrent'), seconds to wait (a string)}.
_ADMIT = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local brate, bburst, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local limit, hold = tonumber(ARGV[6]), tonumber(ARGV[8])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local saved = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'bytes')
local tokens, ts, bytes = tonumber(saved[1]), tonumber(saved[2]), tonumber(saved[3])
if tokens == nil or ts == nil then tokens, ts = burst, now end
if bytes == nil then bytes = bburst end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
  bytes = math.min(bburst, bytes + (now - ts) * brate)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now * 1000)
local verdict, wait = 'ok', 0
if tokens < 1 then
  verdict, wait = 'rate', (1 - tokens) / rate
elseif bytes < cost then
  verdict, wait = 'bytes', (cost - bytes) / brate
elseif redis.call('ZCARD', KEYS[2]) >= limit then
  verdict, wait = 'concurrent', 1
else
  tokens, bytes = tokens - 1, bytes - cost
  redis.call('ZADD', KEYS[2], now * 1000 + hold, ARGV[7])
  redis.call('PEXPIRE', KEYS[2], hold)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now), 'bytes', tostring(bytes))
local full = math.max(burst / rate, bburst / brate)
redis.call('PEXPIRE', KEYS[1], math.min(math.ceil(full * 1000) + 1000, 86400000))
return {verdict, tostring(wait)}
"""


@dataclass(frozen=True)
class Admission:
    """The outcome of ``RateLimiter.admit``: ``verdict`` is ``ok`` (admitted: ``release``
    it) or what refused it (``rate``, ``bytes``, ``concurrent``)."""

    verdict: str
    wait_seconds: float

    @property
    def admitted(self) -> bool:
        """True when the request may proceed."""
        return self.verdict == "ok"

    @property
    def retry_after(self) -> int:
        """Whole seconds for a ``Retry-After`` header (at least 1)."""
        return max(1, math.ceil(self.wait_seconds))


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
        self._admit = client.register_script(_ADMIT)

    def key(self, tenant_id: str) -> str:
        """The Redis key of ``tenant_id``'s bucket."""
        return f"{{{self._prefix}:rate:{tenant_id}}}"

    def take(self, tenant_id: str, rate: float, burst: int, cost: int = 1) -> RateDecision:
        """Take ``cost`` tokens from the tenant's bucket if it holds them.

        ``rate`` tokens flow in per second up to ``burst``. Raises ``StoreUnavailable``
        when Redis cannot be reached. ``rate`` and ``burst`` are the settings' (validated there:
        above 0).
        """
        try:
            allowed, wait = self._take(keys=[self.key(tenant_id)], args=[repr(float(rate)), burst, cost])
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"rate limiter unavailable: {exc}") from exc
        return RateDecision(allowed=bool(int(allowed)), wait_seconds=float(text(wait)))

    def admit(
        self,
        tenant_id: str,
        request_id: str,
        *,
        rate: float,
        burst: int,
        byte_rate: float,
        byte_burst: int,
        body_bytes: int,
        max_in_flight: int,
        hold_seconds: float = 300.0,
    ) -> Admission:
        """Take a request token and ``body_bytes`` from the tenant's bucket and a place among
        its ``max_in_flight`` requests in flight (held ``hold_seconds`` at most), all or
        nothing (see the module docstring). Raises ``StoreUnavailable`` when Redis cannot
        be reached."""
        key = self.key(tenant_id)
        args: list[str | int] = [repr(float(rate)), burst, repr(float(byte_rate)), byte_burst]
        args += [body_bytes, max_in_flight, request_id, int(hold_seconds * 1000)]
        try:
            verdict, wait = self._admit(keys=[key, f"{key}:inflight"], args=args)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"rate limiter unavailable: {exc}") from exc
        return Admission(text(verdict), float(text(wait)))

    def release(self, tenant_id: str, request_id: str) -> None:
        """Give back the place ``admit`` took (the response was sent)."""
        try:
            self.client.zrem(f"{self.key(tenant_id)}:inflight", request_id)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"rate limiter unavailable: {exc}") from exc
