"""The service sections: ``service`` (windows and triggers), ``http``, ``proxy``, ``logging``
and the per-tenant overrides."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, field_validator, model_validator

from ctxcore.config.base import STRICT
from ctxcore.config.compaction import ModelSettings, RecallSettings
from ctxcore.errors import ConfigError
from ctxcore.state.keys import validate_id

__all__ = ["HttpSettings", "LoggingSettings", "ProxySettings", "ServiceSettings", "TenantSettings"]


class ServiceSettings(BaseModel):
    """Fast path and compaction targets, as ratios of the budget a client asks for."""

    model_config = STRICT
    # Compaction is asked for once the raw view is over the budget itself: until the worker
    # lands it, the headroom-aware rules and the fallback fit the served window (oldest
    # first), so the verbatim tail uses the whole budget and each compaction saves a
    # quarter of it (fewer, larger summaries than a trigger below the budget would make).
    trigger_ratio: float = Field(default=1.0, gt=0, le=1)
    target_ratio: float = Field(default=0.8, gt=0, le=1)
    default_budget: int = Field(default=128_000, gt=0)
    # Summariser tokens (input + output) a tenant's conversations may spend per UTC day,
    # for tenants without their own ``summariser_tokens_per_day``: 0 runs them on the rules
    # alone (no summariser call at all); None (unset) sets no cap.
    summariser_tokens_per_day: int | None = Field(default=None, ge=0)
    max_messages_per_append: int = Field(default=1000, gt=0)
    max_message_chars: int = Field(default=2_000_000, gt=0)
    offload_ttl_seconds: int | None = Field(default=None, gt=0)
    # Days without an append or a window after which a conversation expires, all of it
    # (None: never). Tenants may override it.
    retention_days: int | None = Field(default=None, gt=0)

    @property
    def chunk_ratio(self) -> float:
        """What one re-base frees, as a share of the budget: the room between trigger and
        target. The fast path's rules free room in chunks of ``int(budget_tokens *
        chunk_ratio)`` tokens too while a worker lags (0: one result at a time, as far as
        needed)."""
        return self.trigger_ratio - self.target_ratio

    def chunk_tokens(self, budget_tokens: int) -> int:
        """What one re-base frees at ``budget_tokens`` (``chunk_ratio`` of it)."""
        return int(budget_tokens * self.chunk_ratio)

    @model_validator(mode="after")
    def _ratios(self) -> Self:
        if self.target_ratio > self.trigger_ratio:
            raise ConfigError(
                f"target_ratio ({self.target_ratio}) must be <= trigger_ratio ({self.trigger_ratio})"
            )
        return self


def byte_rate_ok(value: float) -> bool:
    """A byte rate above 0 and finite: 0 would refuse every request with a body, which is
    what a request rate is for."""
    return value > 0 and value != float("inf")


BYTE_RATE_RULE = (
    "must be a finite number of bytes per second above 0, got {!r} (to block a tenant, use the "
    "request rate limit, not a byte rate of 0)"
)


class HttpSettings(BaseModel):
    """HTTP API: limits and the bearer-token table (sha256 of token -> tenant id)."""

    model_config = STRICT
    host: str = "127.0.0.1"
    port: int = Field(default=8080, gt=0, lt=65536)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    tokens: dict[str, str] = Field(default_factory=dict)
    requests_per_second: float = Field(default=50.0, gt=0)
    burst: int = Field(default=100, gt=0)
    # Request bodies a tenant may send per second, in the same Redis token bucket as its
    # requests (charged by the declared Content-Length before the body is read; a body
    # without one is charged ``max_body_bytes``). The bucket holds at most
    # max(max_body_bytes, bytes_per_second), so one maximum-size body always fits.
    bytes_per_second: float = 1024.0 * 1024.0
    # Requests of one tenant in flight at once, over every API process (Redis).
    max_concurrent_requests: int = Field(default=20, gt=0)
    # uvicorn's line per request (a few percent of the API's CPU under load).
    access_log: bool = True
    # API processes on the one port (``ctxcore serve --workers N``): the fast path is CPU
    # bound and one Python process serves one request at a time; N processes share nothing
    # but Redis, and their metrics are summed (prometheus-client's multiprocess mode).
    workers: int = Field(default=1, gt=0)

    @field_validator("bytes_per_second")
    @classmethod
    def _byte_rate(cls, value: float) -> float:
        if not byte_rate_ok(value):
            raise ConfigError(BYTE_RATE_RULE.format(value))
        return value

    @field_validator("tokens")
    @classmethod
    def _hashes(cls, value: dict[str, str]) -> dict[str, str]:
        for digest, tenant in value.items():
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(
                    "http.tokens keys must be sha256 hex digests of bearer tokens (see hash_token)"
                )
            validate_id(tenant, "tenant_id")
        return value


class ProxySettings(BaseModel):
    """The OpenAI-compatible proxy's upstream: the agent's model (``model`` is the summariser).

    ``upstream_api_key_env`` is read once at start-up (None: no key is sent).
    ``upstream_timeout`` bounds each read of an upstream call, ``upstream_deadline`` the call
    as a whole (a streamed reply included)."""

    model_config = STRICT
    upstream_base_url: str | None = None
    upstream_api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    upstream_timeout: float = Field(default=600.0, gt=0)
    # The whole upstream call, a stream included (upstream_timeout bounds each read): a
    # reply trickling one chunk at a time is cut here with an error event.
    upstream_deadline: float = Field(default=600.0, gt=0)
    context_window_tokens: dict[str, int] = Field(default_factory=dict)
    default_reserve_tokens: int = Field(default=4096, ge=0)


class LoggingSettings(BaseModel):
    """How the service and the workers write their logs: ``text`` keeps each tool's own
    format (uvicorn's, Celery's), ``json`` writes one JSON object a line (for a collector)."""

    model_config = STRICT
    format: Literal["text", "json"] = "text"


class TenantSettings(BaseModel):
    """Per-tenant overrides."""

    model_config = STRICT
    model: ModelSettings | None = None
    # Replaces the global proxy section whole for this tenant's requests.
    proxy: ProxySettings | None = None
    # Replaces the global recall section whole for this tenant's conversations.
    recall: RecallSettings | None = None
    default_budget: int | None = Field(default=None, gt=0)
    requests_per_second: float | None = Field(default=None, gt=0)
    bytes_per_second: float | None = None
    max_concurrent_requests: int | None = Field(default=None, gt=0)
    max_conversations: int | None = Field(default=None, gt=0)
    retention_days: int | None = Field(default=None, gt=0)
    # This tenant's summariser tokens per UTC day (None: ``service.summariser_tokens_per_day``).
    summariser_tokens_per_day: int | None = Field(default=None, ge=0)

    @field_validator("bytes_per_second")
    @classmethod
    def _byte_rate(cls, value: float | None) -> float | None:
        if value is not None and not byte_rate_ok(value):
            raise ConfigError(BYTE_RATE_RULE.format(value))
        return value
