"""Summariser usage per tenant, kept in Redis for ``GET /v1/usage``.

Billing data: summed over every worker process and kept across restarts, hence Redis and
not the processes' Prometheus series (``workers/prom_worker.py``). Each tenant's hash is
``{<prefix>:usage:<tenant>}``, its own cluster slot.
"""

from __future__ import annotations

import logging

import redis
from redis.exceptions import RedisClusterException

log = logging.getLogger(__name__)

__all__ = ["Usage"]

_ERRORS = (redis.RedisError, RedisClusterException)
_FIELDS = ("calls", "input_tokens", "output_tokens")


class Usage:
    """Summariser calls and tokens per tenant; failing to record never fails a stage."""

    def __init__(self, client: redis.Redis, prefix: str = "ctxcore") -> None:
        self.client = client
        self._prefix = prefix

    def key(self, tenant: str) -> str:
        """The tenant's usage hash, under its own hash tag (one cluster slot per tenant)."""
        return f"{{{self._prefix}:usage:{tenant}}}"

    def add(self, tenant: str, calls: int, input_tokens: int, output_tokens: int) -> None:
        """Add one stage's summariser usage to ``tenant``'s."""
        try:
            pipe = self.client.pipeline(transaction=False)
            key = self.key(tenant)
            pipe.hincrby(key, f"{tenant}:calls", calls)
            pipe.hincrby(key, f"{tenant}:input_tokens", input_tokens)
            pipe.hincrby(key, f"{tenant}:output_tokens", output_tokens)
            pipe.execute()
        except _ERRORS:
            log.debug("usage not recorded: Redis unavailable", exc_info=True)

    def of(self, tenant: str) -> dict[str, int]:
        """Summariser calls and tokens of one tenant."""
        values = self.client.hmget(self.key(tenant), [f"{tenant}:{f}" for f in _FIELDS])
        return {n: int(v or 0) for n, v in zip(_FIELDS, values, strict=True)}
