"""Each tenant's summariser tokens per UTC day: reserved before every model call, settled after.

``tenants.<id>.summariser_tokens_per_day`` (else ``service.summariser_tokens_per_day``; unset:
no cap, still counted; 0: no summariser call at all) caps what one tenant's conversations
may spend on the summariser in a UTC day. ``BudgetedModel`` wraps a tenant's model client:
before each call it reserves the call's most tokens (the prompt as counted plus
``max_tokens``) with one Lua script on the tenant's day counter, refused with
``SummariserBudgetExhausted`` when the reservation would take the day over the cap (a
reservation larger than the whole cap is refused at once); after the call it settles the
real count the endpoint reported (a failed call releases its reservation: nothing was
billed). Concurrent stages therefore never reserve past the cap together, and the day's
total overshoots the cap only when an endpoint reports more than the reservation, by at
most that one call's difference.

Key: ``{<prefix>:usage:<tenant>}:day:<YYYY-MM-DD>``, a counter under the tenant's usage hash
tag (one cluster slot per tenant, every script touches that one key), kept two days. A call
is counted on the day it reserved, even when it settles after midnight.

Unlike ``workers.usage`` (a best-effort record after the call), this accounting is part of
the call: when Redis cannot be reached at reservation the model is not called and
``StoreUnavailable`` fails the stage (retried like any store outage).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from redis.exceptions import RedisClusterException

from ctxcore.config import Settings
from ctxcore.errors import OperationFailed, StoreUnavailable
from ctxcore.messages import AnyMessage
from ctxcore.summarize.model import Completion, ModelClient, OutputContract
from ctxcore.tokens import TokenCounter

__all__ = [
    "BudgetedModel",
    "Reservation",
    "SummariserBudget",
    "SummariserBudgetExhausted",
    "summariser_cap",
    "utc_day",
    "utc_now",
]

log = logging.getLogger(__name__)

_ERRORS = (redis.RedisError, RedisClusterException)
_TTL_SECONDS = 2 * 24 * 3600

# KEYS[1]: the tenant's day counter. ARGV: tokens, cap (-1: none), ttl seconds.
# Returns {1 reserved | 0 refused, the day's tokens after (reserved) or now (refused)}.
_RESERVE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
if cap >= 0 and used + want > cap then return {0, used} end
local now = redis.call('INCRBY', KEYS[1], want)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return {1, now}
"""

# KEYS[1]: the day counter the reservation was made on. ARGV: real tokens - reserved tokens.
_SETTLE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
"""


def utc_now() -> datetime:
    """The clock of daily budgets and holds (tests replace this function to move the day)."""
    return datetime.now(UTC)


def utc_day(now: datetime) -> str:
    """The UTC day ``now`` falls on, ``YYYY-MM-DD`` (the key of a tenant's daily budget)."""
    return now.astimezone(UTC).date().isoformat()


def summariser_cap(settings: Settings, tenant_id: str) -> int | None:
    """A tenant's summariser tokens per UTC day: its own, else the service's (None: no cap)."""
    own = settings.tenant(tenant_id).summariser_tokens_per_day
    return own if own is not None else settings.service.summariser_tokens_per_day


class SummariserBudgetExhausted(OperationFailed):
    """A summariser call was refused: the tenant's tokens for the UTC day would pass its cap.

    ``used`` is what the day has spent (reserved included), ``cap`` the tenant's cap,
    ``needed`` what the call asked for, ``day`` the UTC day.
    """

    def __init__(
        self, message: str, *, tenant: str = "", used: int = 0, cap: int = 0, needed: int = 0, day: str = ""
    ) -> None:
        super().__init__(message)
        self.tenant, self.used, self.cap, self.needed, self.day = tenant, used, cap, needed, day


@dataclass(frozen=True)
class Reservation:
    """Tokens reserved for one call on the counter of the day they were reserved on."""

    tenant: str
    key: str
    day: str
    tokens: int


class SummariserBudget:
    """The tenants' daily summariser counters (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        *,
        on_settled: Callable[[str, int], None] | None = None,
    ) -> None:
        self.client = client
        self._prefix = prefix
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        # Called with (tenant, real tokens) after each settled call (Prometheus).
        self._on_settled = on_settled

    def key(self, tenant: str, day: str) -> str:
        """The tenant's counter of ``day``, under its usage hash tag."""
        return f"{{{self._prefix}:usage:{tenant}}}:day:{day}"

    def reserve(self, tenant: str, tokens: int, cap: int | None) -> Reservation:
        """Reserve ``tokens`` on today's counter: ``SummariserBudgetExhausted`` over ``cap``,
        ``StoreUnavailable`` when Redis cannot be reached (the call must not happen)."""
        day = utc_day(utc_now())
        key = self.key(tenant, day)
        try:
            ok, total = self._reserve(keys=[key], args=[tokens, -1 if cap is None else cap, _TTL_SECONDS])
        except _ERRORS as exc:
            raise StoreUnavailable(
                f"summariser accounting unavailable: tokens of tenant {tenant} cannot be reserved "
                f"({exc}); the model is not called"
            ) from exc
        if not int(ok):
            used = int(total)
            whole = " (more than the whole cap)" if cap is not None and tokens > cap else ""
            raise SummariserBudgetExhausted(
                f"tenant {tenant} has used {used} of its {cap} summariser tokens for {day}; the call "
                f"needs {tokens}{whole}",
                tenant=tenant,
                used=used,
                cap=cap or 0,
                needed=tokens,
                day=day,
            )
        return Reservation(tenant, key, day, tokens)

    def settle(self, reservation: Reservation, tokens: int) -> None:
        """Replace the reservation by the real count (0: the call failed, nothing was spent).

        Not reaching Redis here is logged, not raised: the call has happened and its
        reservation, an upper bound, stays counted; failing the stage would only spend again.
        """
        try:
            self._settle(keys=[reservation.key], args=[tokens - reservation.tokens])
        except _ERRORS:
            log.error(
                "summariser tokens of tenant %s not settled (Redis unavailable): its reservation of %d "
                "stays counted for %s instead of the real %d",
                reservation.tenant,
                reservation.tokens,
                reservation.day,
                tokens,
                exc_info=True,
            )
        if self._on_settled is not None and tokens:
            self._on_settled(reservation.tenant, tokens)

    def used(self, tenant: str) -> tuple[str, int]:
        """Today's UTC day and the tokens counted on it for ``tenant`` (reservations included)."""
        day = utc_day(utc_now())
        try:
            raw = self.client.get(self.key(tenant, day))
        except _ERRORS as exc:
            raise StoreUnavailable(f"summariser accounting unavailable: {exc}") from exc
        return day, int(raw or 0)


class BudgetedModel:
    """A tenant's ``ModelClient`` whose every call is reserved on its daily budget first."""

    def __init__(
        self,
        client: ModelClient,
        budget: SummariserBudget,
        tenant: str,
        counter: TokenCounter,
        cap: int | None,
    ) -> None:
        self.client = client
        self.budget = budget
        self.tenant = tenant
        self.counter = counter
        self.cap = cap

    @property
    def name(self) -> str:
        """The wrapped client's model name."""
        return self.client.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """Reserve the call's most tokens, call, settle the real count."""
        expected = self.counter.count_messages(list(messages)) + max_tokens
        reservation = self.budget.reserve(self.tenant, expected, self.cap)
        try:
            completion = self.client.complete(messages, max_tokens=max_tokens, contract=contract)
        except BaseException:
            self.budget.settle(reservation, 0)
            raise
        usage = completion.usage
        real = usage.total_tokens or usage.input_tokens + usage.output_tokens
        # An endpoint that reports no usage: its reservation (an upper bound) stands.
        self.budget.settle(reservation, real or expected)
        return completion
