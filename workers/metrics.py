"""Service metrics kept in Redis so every worker and API process adds to the same counters.

Label values come from small closed sets (stage kinds, outcomes, error kinds, routes), so
cardinality stays bounded whatever tenants and conversations do. ``render()`` produces the
Prometheus text exposition served at ``GET /metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

log = logging.getLogger(__name__)

__all__ = ["Metrics"]

_HELP = {
    "ctxcore_compactions_total": ("counter", "Pipeline stages run, by stage kind and outcome."),
    "ctxcore_stage_seconds": ("summary", "Wall time of pipeline stages, by stage kind."),
    "ctxcore_tokens_saved_total": ("counter", "Tokens removed from conversation views by compaction."),
    "ctxcore_failures_total": ("counter", "Failed stages, by error kind."),
    "ctxcore_cas_conflicts_total": ("counter", "Compare-and-swap saves lost to another writer."),
    "ctxcore_fast_path_seconds": ("summary", "Latency of get_window on the fast path."),
    "ctxcore_fallback_windows_total": ("counter", "Windows served with the synchronous fallback."),
    "ctxcore_circuit_open_total": ("counter", "Calls refused by an open circuit breaker."),
}


def _label_key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


class Metrics:
    """Counters and summaries in one Redis hash; failures to record never fail a request."""

    def __init__(self, client: redis.Redis, prefix: str = "ctxcore") -> None:
        self.client = client
        tag = f"{{{prefix}:metrics}}"
        self.key = f"{tag}:values"
        self._prefix = prefix

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to a counter."""
        try:
            self.client.hincrbyfloat(self.key, _label_key(name, labels), value)
        except redis.RedisError:
            log.debug("metrics unavailable", exc_info=True)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Record one observation of a summary (sum and count)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrbyfloat(self.key, _label_key(f"{name}_sum", labels), seconds)
            pipe.hincrbyfloat(self.key, _label_key(f"{name}_count", labels), 1)
            pipe.execute()
        except redis.RedisError:
            log.debug("metrics unavailable", exc_info=True)

    def snapshot(self) -> dict[str, float]:
        """Every series and its value."""
        raw = self.client.hgetall(self.key)
        return {
            (k.decode() if isinstance(k, bytes) else str(k)): float(v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }

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
        except redis.RedisError:
            log.debug("metrics unavailable", exc_info=True)

    def usage(self, tenant: str) -> dict[str, int]:
        """Summariser calls and tokens of one tenant."""
        key = self.usage_key(tenant)
        fields = [f"{tenant}:calls", f"{tenant}:input_tokens", f"{tenant}:output_tokens"]
        values = self.client.hmget(key, fields)
        names = ["calls", "input_tokens", "output_tokens"]
        return {n: int(v or 0) for n, v in zip(names, values, strict=True)}
