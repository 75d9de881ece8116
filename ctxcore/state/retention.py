"""How long a conversation outlives its last append or window (``service.retention_days``).

``Retention`` is what the stores are given (built from the settings by the workers'
runtime, in seconds so a test can use one): the global retention, the tenants' overrides
and the offloads' own TTL. With no retention for a tenant nothing expires and no TTL is
set. The Redis backends turn it into key TTLs (``ctxcore.state.redis.retention``); the SQL
backends stamp ``last_active_at`` and the workers' sweep deletes what went idle.

Windows refresh expiry at most every ``REFRESH_EVERY_SECONDS`` (``refresh_due``): a
conversation expires between ``retention - REFRESH_EVERY_SECONDS`` and ``retention`` after
its last window, exactly ``retention`` after its last append.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ctxcore.errors import ConfigError

__all__ = ["ACTIVITY_RESOLUTION_SECONDS", "REFRESH_EVERY_SECONDS", "Retention"]

# A window rewrites expiry (Redis TTLs, SQL's last_active_at) only when it is more than this
# far behind: windows are the hot path and should almost never write for it.
REFRESH_EVERY_SECONDS = 3600.0
# SQL stamps last_active_at at this resolution, so a stamp changes (and its index entry
# moves) at most hourly per conversation.
ACTIVITY_RESOLUTION_SECONDS = REFRESH_EVERY_SECONDS


def _positive(value: float | None, what: str) -> None:
    if value is not None and not value > 0:
        raise ConfigError(f"{what} must be a positive number of seconds or None, got {value!r}")


@dataclass(frozen=True)
class Retention:
    """Seconds of inactivity after which a conversation expires (None: never).

    ``tenants`` overrides ``seconds`` per tenant. ``offload_ttl_seconds`` is the offloads'
    own TTL (``service.offload_ttl_seconds``): when it is shorter than a tenant's retention
    the offloads keep it (they expire that long after the latest put, as without retention)
    and refreshes leave them alone; otherwise they expire with the conversation.
    """

    seconds: float | None = None
    tenants: Mapping[str, float] = field(default_factory=dict)
    offload_ttl_seconds: float | None = None

    def __post_init__(self) -> None:
        _positive(self.seconds, "retention")
        for tenant, seconds in self.tenants.items():
            _positive(seconds, f"retention of tenant {tenant!r}")
        _positive(self.offload_ttl_seconds, "offload_ttl_seconds")

    @classmethod
    def from_days(
        cls,
        days: float | None,
        tenants: Mapping[str, float | None] | None = None,
        offload_ttl_seconds: float | None = None,
    ) -> Retention:
        """From ``retention_days`` (global, then per tenant: None there means the global one)."""
        overrides = {t: d * 86400.0 for t, d in (tenants or {}).items() if d is not None}
        return cls(days * 86400.0 if days is not None else None, overrides, offload_ttl_seconds)

    @property
    def enabled(self) -> bool:
        """True when some conversation can expire."""
        return self.seconds is not None or bool(self.tenants)

    def seconds_for(self, tenant_id: str) -> float | None:
        """The tenant's retention in seconds (None: its conversations never expire)."""
        return self.tenants.get(tenant_id, self.seconds)

    def ttl_ms(self, tenant_id: str) -> int:
        """The tenant's retention in milliseconds, 0 when none (the scripts' convention)."""
        seconds = self.seconds_for(tenant_id)
        return max(round(seconds * 1000), 1) if seconds is not None else 0

    def refresh_due(self, tenant_id: str, remaining_ms: int) -> bool:
        """True when a window must refresh expiry: the remaining TTL (``PTTL``: -1 none,
        -2 no key) is more than ``REFRESH_EVERY_SECONDS`` below the full retention (half of
        it for retentions under two hours, so short test retentions refresh too)."""
        ttl = self.ttl_ms(tenant_id)
        if ttl == 0:
            return False
        if remaining_ms < 0:
            return True
        return remaining_ms < ttl - min(REFRESH_EVERY_SECONDS * 1000, ttl / 2)

    def offloads_apart(self, tenant_id: str) -> bool:
        """True when the tenant's offloads keep their own, shorter TTL (see the class doc)."""
        own, seconds = self.offload_ttl_seconds, self.seconds_for(tenant_id)
        return own is not None and (seconds is None or own < seconds)
