"""A circuit breaker for summarisation endpoints, shared by every worker through Redis.

Without it, a failing endpoint is called by every stage of every conversation of a tenant,
each retried by Celery: hundreds of calls a minute that cannot succeed and that a provider
may count against the tenant. The breaker counts *consecutive* failed calls per tenant +
endpoint; after ``failure_threshold`` of them it opens and calls are refused at once
(``CircuitOpenError``, a transient ``server_unstable`` failure carrying ``retry_after``, so
the stage task retries later instead of escalating to a lossier stage). After
``reset_seconds`` it half-opens: exactly one probe call goes through; its success closes the
circuit, its failure opens it for another ``reset_seconds``. A probe whose worker dies
never reports back, so after another ``reset_seconds`` the next caller probes.

Only failures that say the endpoint is unwell count (rate limits, timeouts, 5xx, garbage
answers: ``TRANSIENT_KINDS``). A context overflow or a bad request is an answer from a
healthy endpoint about *our* request: it neither counts nor resets.

State: one Redis hash per tenant + endpoint, ``{<prefix>:circuit:<tenant>}:<sha256(url)[:16]>``
(fields ``state``, ``failures``, ``since``, ``opened``), under a hash tag per tenant so the
tenants spread over a Redis Cluster's masters; each write refreshes a one-week expiry so circuits of
tenants that left do not pile up. Every transition is one Lua script, so concurrent
workers agree. The clock is the caller's (``time.time``), injectable for tests. If Redis
itself is unreachable the breaker lets calls through: the stage will meet the outage in
its store anyway, and a breaker must never be the reason a healthy endpoint goes unused.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import redis
from redis.exceptions import RedisClusterException

from ctxcore.messages import AnyMessage
from ctxcore.summarize.errors import TRANSIENT_KINDS, ModelCallError, classify_error
from ctxcore.summarize.model import Completion, ModelClient, OutputContract

__all__ = ["CircuitBreaker", "CircuitBreakerClient", "CircuitDecision", "CircuitOpenError", "CircuitState"]

log = logging.getLogger(__name__)

CircuitState = Literal["closed", "open", "half_open"]
_TTL_SECONDS = 7 * 24 * 3600

# KEYS[1]: the circuit. ARGV: now, reset seconds, ttl.
# Returns {1 = allowed (closed), 2 = allowed as the half-open probe, 0 = refused; wait seconds}.
_ALLOW = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st or st == 'closed' then return {1, '0'} end
local since = tonumber(redis.call('HGET', KEYS[1], 'since') or '0')
local wait = since + tonumber(ARGV[2]) - tonumber(ARGV[1])
if wait > 0 then return {0, tostring(wait)} end
redis.call('HSET', KEYS[1], 'state', 'half_open', 'since', ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return {2, '0'}
"""

# KEYS[1]: the circuit. ARGV: now, failure threshold, ttl. Returns 1 when this failure opened it.
_FAILURE = """
local st = redis.call('HGET', KEYS[1], 'state') or 'closed'
local n = redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
if st == 'half_open' or (st == 'closed' and n >= tonumber(ARGV[2])) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'since', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'opened', 1)
  return 1
end
return 0
"""

# KEYS[1]: the circuit. ARGV: ttl.
_SUCCESS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


@dataclass(frozen=True)
class CircuitDecision:
    """Whether a call may go ahead; ``probe`` when it is the half-open trial call."""

    allowed: bool
    probe: bool = False
    retry_after: float = 0.0


class CircuitOpenError(ModelCallError):
    """The endpoint's circuit is open: the call was refused without reaching the endpoint.

    A ``server_unstable`` failure (transient: the stage is retried, not escalated) whose
    ``retry_after`` is the time until the circuit half-opens.
    """

    circuit_open = True

    def __init__(self, endpoint: str, retry_after: float) -> None:
        super().__init__(
            "server_unstable",
            f"circuit open for the summarisation endpoint {endpoint} after repeated failures; "
            f"the next trial call is allowed in {retry_after:.1f}s",
            None,
            retry_after,
        )


class CircuitBreaker:
    """Consecutive-failure circuit breaker per tenant + endpoint, state in Redis (see module doc)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        *,
        failure_threshold: int = 5,
        reset_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Both limits are validated once, by the settings (worker.circuit_*: above 0).
        self.client = client
        self.failure_threshold = failure_threshold
        self.reset_seconds = reset_seconds
        self._clock = clock
        self._prefix = prefix
        self._allow = client.register_script(_ALLOW)
        self._failure = client.register_script(_FAILURE)
        self._success = client.register_script(_SUCCESS)

    def key(self, tenant: str, endpoint: str) -> str:
        """The Redis key of one circuit (the endpoint URL is hashed: it may carry credentials)."""
        digest = hashlib.sha256(endpoint.encode("utf-8")).hexdigest()[:16]
        return f"{{{self._prefix}:circuit:{tenant}}}:{digest}"

    def allow(self, tenant: str, endpoint: str) -> CircuitDecision:
        """May a call to ``endpoint`` for ``tenant`` go ahead now?"""
        try:
            code, wait = self._allow(
                keys=[self.key(tenant, endpoint)], args=[self._clock(), self.reset_seconds, _TTL_SECONDS]
            )
        except (redis.RedisError, RedisClusterException):
            log.debug("circuit breaker state unavailable; letting the call through", exc_info=True)
            return CircuitDecision(True)
        code = int(code)
        return CircuitDecision(code != 0, probe=code == 2, retry_after=max(float(wait), 0.0))

    def record_failure(self, tenant: str, endpoint: str) -> bool:
        """Count a failed call; True when it opened the circuit."""
        try:
            opened = self._failure(
                keys=[self.key(tenant, endpoint)],
                args=[self._clock(), self.failure_threshold, _TTL_SECONDS],
            )
        except (redis.RedisError, RedisClusterException):
            log.debug("circuit breaker state unavailable", exc_info=True)
            return False
        if opened:
            log.warning(
                "circuit opened for tenant %s on %s: %d consecutive failures; next trial in %gs",
                tenant,
                endpoint,
                self.failure_threshold,
                self.reset_seconds,
            )
        return bool(opened)

    def record_success(self, tenant: str, endpoint: str) -> None:
        """A call succeeded: close the circuit and reset the failure count."""
        try:
            self._success(keys=[self.key(tenant, endpoint)], args=[_TTL_SECONDS])
        except (redis.RedisError, RedisClusterException):
            log.debug("circuit breaker state unavailable", exc_info=True)

    def state(self, tenant: str, endpoint: str) -> CircuitState:
        """The circuit's stored state (``open`` stays ``open`` until a caller half-opens it)."""
        raw = self.client.hget(self.key(tenant, endpoint), "state")
        text = raw.decode() if isinstance(raw, bytes) else (raw or "closed")
        if text == "open":
            return "open"
        return "half_open" if text == "half_open" else "closed"

    def failures(self, tenant: str, endpoint: str) -> int:
        """Failed calls counted since the circuit last closed."""
        return int(self.client.hget(self.key(tenant, endpoint), "failures") or 0)


class CircuitBreakerClient:
    """A ``ModelClient`` that asks the breaker before each call and reports the outcome.

    ``on_refused`` runs for each refused call (the runtime counts
    ``ctxcore_circuit_open_total`` there).
    """

    def __init__(
        self,
        client: ModelClient,
        breaker: CircuitBreaker,
        tenant: str,
        endpoint: str,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.breaker = breaker
        self.tenant = tenant
        self.endpoint = endpoint
        self._on_refused = on_refused

    @property
    def name(self) -> str:
        """The wrapped client's model name."""
        return self.client.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """One call through the breaker; ``CircuitOpenError`` without calling when it is open."""
        decision = self.breaker.allow(self.tenant, self.endpoint)
        if not decision.allowed:
            if self._on_refused is not None:
                self._on_refused()
            raise CircuitOpenError(self.endpoint, decision.retry_after)
        try:
            completion = self.client.complete(messages, max_tokens=max_tokens, contract=contract)
        except Exception as exc:
            kind = exc.kind if isinstance(exc, ModelCallError) else classify_error(exc)
            if kind in TRANSIENT_KINDS:
                self.breaker.record_failure(self.tenant, self.endpoint)
            raise
        self.breaker.record_success(self.tenant, self.endpoint)
        return completion
