"""Service metrics kept in Redis so every worker and API process adds to the same counters.

Each tenant's series live in its own hash, ``{<prefix>:metrics:<tenant>}`` (its own cluster
slot: no master serves every tenant's counters); a series recorded without a tenant goes to
``{<prefix>:metrics}:values``. ``snapshot`` and ``/metrics`` sum the tenants configured
(``tenants.<id>`` and the tenants of ``http.tokens``) and those this process recorded for;
series carry no tenant label, so the exposition is the deployment's total.

Label values come from small closed sets (stage kinds, outcomes, error kinds, routes), so
cardinality stays bounded whatever tenants and conversations do. ``render()`` produces the
Prometheus text exposition served at ``GET /metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import redis
from redis.exceptions import RedisClusterException

log = logging.getLogger(__name__)

__all__ = ["Metrics"]

_ERRORS = (redis.RedisError, RedisClusterException)

_HELP = {
    "ctxcore_compactions_total": ("counter", "Pipeline stages run, by stage kind and outcome."),
    "ctxcore_stage_seconds": ("summary", "Wall time of pipeline stages, by stage kind."),
    "ctxcore_tokens_saved_total": ("counter", "Tokens removed from conversation views by compaction."),
    "ctxcore_failures_total": ("counter", "Failed stages, by error kind."),
    "ctxcore_cas_conflicts_total": ("counter", "Compare-and-swap saves lost to another writer."),
    "ctxcore_fast_path_seconds": ("summary", "Latency of get_window on the fast path."),
    "ctxcore_fallback_windows_total": ("counter", "Windows served with the synchronous fallback."),
    "ctxcore_circuit_open_total": ("counter", "Calls refused by an open circuit breaker."),
    "ctxcore_dead_letter_messages": (
        "gauge",
        "Messages in the RabbitMQ dead-letter queue <prefix>.dead (delivered worker.delivery_limit times).",
    ),
}


def _label_key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


class Metrics:
    """Counters and summaries in Redis hashes per tenant; failures to record never fail a request."""

    def __init__(self, client: redis.Redis, prefix: str = "ctxcore", tenants: Iterable[str] = ()) -> None:
        self.client = client
        self.key = f"{{{prefix}:metrics}}:values"
        self._prefix = prefix
        self._tenants = set(tenants)

    def tenant_key(self, tenant: str | None) -> str:
        """The hash of ``tenant``'s series (the tenantless one for None)."""
        return self.key if tenant is None else f"{{{self._prefix}:metrics:{tenant}}}"

    def _key(self, tenant: str | None) -> str:
        if tenant is not None:
            self._tenants.add(tenant)
        return self.tenant_key(tenant)

    def inc(self, name: str, value: float = 1.0, *, tenant: str | None = None, **labels: str) -> None:
        """Add ``value`` to a counter (in ``tenant``'s hash)."""
        try:
            self.client.hincrbyfloat(self._key(tenant), _label_key(name, labels), value)
        except _ERRORS:
            log.debug("metrics unavailable", exc_info=True)

    def observe(
        self, name: str, seconds: float, *, tenant: str | None = None, also: str | None = None, **labels: str
    ) -> None:
        """Record one observation of a summary (sum and count), in ``tenant``'s hash; ``also``
        names a counter incremented in the same pipeline."""
        key = self._key(tenant)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrbyfloat(key, _label_key(f"{name}_sum", labels), seconds)
            pipe.hincrbyfloat(key, _label_key(f"{name}_count", labels), 1)
            if also is not None:
                pipe.hincrbyfloat(key, _label_key(also, labels), 1)
            pipe.execute()
        except _ERRORS:
            log.debug("metrics unavailable", exc_info=True)

    def snapshot(self) -> dict[str, float]:
        """Every series and its value, summed over the tenantless hash and the known tenants'."""
        pipe = self.client.pipeline(transaction=False)
        for key in [self.key, *(self.tenant_key(t) for t in sorted(self._tenants))]:
            pipe.hgetall(key)
        out: dict[str, float] = {}
        for raw in pipe.execute():
            for k, v in raw.items():
                series = k.decode() if isinstance(k, bytes) else str(k)
                out[series] = out.get(series, 0.0) + float(v.decode() if isinstance(v, bytes) else v)
        return out

    def render(self, extra: Mapping[str, float] | None = None) -> str:
        """Prometheus text format of all series (plus ``extra`` gauges such as queue depth)."""
        values = self.snapshot()
        values.update(extra or {})
        lines: list[str] = []
        seen: set[str] = set()
        for series in sorted(values):
            base = series.split("{", 1)[0]
            family = base.removesuffix("_sum").removesuffix("_count")
            if family not in seen:
                kind, text = _HELP.get(family, ("gauge", family.replace("_", " ")))
                lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}"]
                seen.add(family)
            lines.append(f"{series} {values[series]:g}")
        return "\n".join(lines) + "\n"

    def usage_key(self, tenant: str) -> str:
        """The tenant's usage hash, under its own hash tag (one cluster slot per tenant)."""
        return f"{{{self._prefix}:usage:{tenant}}}"

    def add_usage(self, tenant: str, calls: int, input_tokens: int, output_tokens: int) -> None:
        """Summariser usage of one tenant (for ``GET /v1/usage``)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            key = self.usage_key(tenant)
            pipe.hincrby(key, f"{tenant}:calls", calls)
            pipe.hincrby(key, f"{tenant}:input_tokens", input_tokens)
            pipe.hincrby(key, f"{tenant}:output_tokens", output_tokens)
            pipe.execute()
        except _ERRORS:
            log.debug("metrics unavailable", exc_info=True)

    def usage(self, tenant: str) -> dict[str, int]:
        """Summariser calls and tokens of one tenant."""
        key = self.usage_key(tenant)
        fields = [f"{tenant}:calls", f"{tenant}:input_tokens", f"{tenant}:output_tokens"]
        values = self.client.hmget(key, fields)
        names = ["calls", "input_tokens", "output_tokens"]
        return {n: int(v or 0) for n, v in zip(names, values, strict=True)}
