"""``Settings``: the one configuration tree of the service, validated at construction.

Sources, lowest precedence first: defaults, a TOML file (``--config`` or
``CTXCORE_CONFIG_FILE``), environment variables ``CTXCORE_<SECTION>__<KEY>`` (nested keys
joined by ``__``, values parsed as JSON when they parse, e.g. ``CTXCORE_HTTP__TOKENS='{...}'``)
plus the short aliases ``CTXCORE_REDIS_URL``, ``CTXCORE_BROKER_URL``, ``CTXCORE_MODEL_BASE_URL``
and ``CTXCORE_MODEL``. Only ``Settings.from_env()`` reads the environment; a constructed
``Settings`` never does.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ctxcore.errors import ConfigError
from ctxcore.recall.index import require_fts5
from ctxcore.state.keys import validate_id
from ctxcore.turns import HARNESS_USER_PATTERNS, UserDetector, compile_patterns

__all__ = [
    "DatabaseSettings",
    "EngineSettings",
    "HttpSettings",
    "ModelSettings",
    "ProxySettings",
    "RedisSettings",
    "ServiceSettings",
    "Settings",
    "TenantSettings",
    "WorkerSettings",
    "environment_variables",
    "hash_token",
]

_STRICT = ConfigDict(extra="forbid", frozen=True)
ENV_PREFIX = "CTXCORE_"
_ALIASES = {
    "CTXCORE_REDIS_URL": ("redis", "url"),
    "CTXCORE_BROKER_URL": ("worker", "broker_url"),
    "CTXCORE_MODEL_BASE_URL": ("model", "base_url"),
    "CTXCORE_MODEL": ("model", "name"),
}


_BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp")
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}")


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token: only hashes are configured or stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class RedisSettings(BaseModel):
    """Redis: broker, locks, fast-path state and log.

    With ``cluster_nodes`` (``host:port`` seeds, a list or one comma-separated string) every
    ctxcore key lives on that Redis Cluster and ``url`` names only Celery's broker and result
    backend, a plain Redis (kombu's Redis transport has no cluster mode).
    """

    model_config = _STRICT
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="ctxcore", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    socket_timeout: float = Field(default=5.0, gt=0)
    cluster_nodes: tuple[str, ...] = ()

    @field_validator("cluster_nodes", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        for node in value if isinstance(value, list | tuple) else ():
            if not isinstance(node, str) or _HOST_PORT.fullmatch(node) is None:
                raise ValueError(f"cluster node {node!r} is not host:port (e.g. 127.0.0.1:7000)")
        return value


class DatabaseSettings(BaseModel):
    """Optional SQL storage of state, log and offloads (``url`` None: Redis holds them)."""

    model_config = _STRICT
    url: str | None = None
    table_prefix: str = Field(default="ctxcore_", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")


class ModelSettings(BaseModel):
    """The summarisation model: any OpenAI-compatible endpoint, or the offline ``ExtractiveModel``
    when ``base_url`` is None."""

    model_config = _STRICT
    base_url: str | None = None
    name: str = "gpt-4o-mini"
    api_key_env: str = Field(default="OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout: float = Field(default=60.0, gt=0)
    max_tokens: int = Field(default=4096, gt=0)
    temperature: float = Field(default=0.0, ge=0, le=2)

    @property
    def offline(self) -> bool:
        """True when no endpoint is configured (the deterministic offline model is used)."""
        return self.base_url is None


class EngineSettings(BaseModel):
    """Tokenizer and conversation-shape knobs shared by every conversation."""

    model_config = _STRICT
    tokenizer_model: str | None = None
    # The newest three steps (call + result each) stay verbatim through L0->L1: the agent acts
    # on what it just did. Only the most aggressive pass may take them.
    keep_recent_messages: int = Field(default=6, ge=0)
    internal_user_prefixes: tuple[str, ...] = ()
    # Regexes of harness-written user messages (never an anchor); () turns the defaults off.
    internal_user_patterns: tuple[str, ...] = HARNESS_USER_PATTERNS
    # Also treat a user message right after a tool-using turn's final reply as internal.
    harness_structure: bool = False
    rule_chain: Literal["default", "none"] = "default"
    # The most of the window one tool result may take in the default chain (ToolResultCap).
    max_result_ratio: float = Field(default=0.25, gt=0, le=1)

    @field_validator("internal_user_patterns")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            compile_patterns(value, "engine.internal_user_patterns")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    def detector(self) -> UserDetector:
        """The ``UserDetector`` these settings describe."""
        return UserDetector(
            extra_prefixes=self.internal_user_prefixes,
            patterns=self.internal_user_patterns,
            harness_structure=self.harness_structure,
        )


class ServiceSettings(BaseModel):
    """Fast path and compaction targets, as ratios of the budget a client asks for."""

    model_config = _STRICT
    # Compaction is asked for once the raw view is over the budget itself: until the worker
    # lands it, the headroom-aware rules and the fallback fit the served window (oldest
    # first), so the verbatim tail uses the whole budget and each compaction saves a
    # quarter of it (fewer, larger summaries than a trigger below the budget would make).
    trigger_ratio: float = Field(default=1.0, gt=0, le=1)
    target_ratio: float = Field(default=0.8, gt=0, le=1)
    default_budget: int = Field(default=128_000, gt=0)
    max_messages_per_append: int = Field(default=1000, gt=0)
    max_message_chars: int = Field(default=2_000_000, gt=0)
    offload_ttl_seconds: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ratios(self) -> Self:
        if self.target_ratio > self.trigger_ratio:
            raise ValueError(
                f"target_ratio ({self.target_ratio}) must be <= trigger_ratio ({self.trigger_ratio})"
            )
        return self


class HttpSettings(BaseModel):
    """HTTP API: limits and the bearer-token table (sha256 of token -> tenant id)."""

    model_config = _STRICT
    host: str = "127.0.0.1"
    port: int = Field(default=8080, gt=0, lt=65536)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    tokens: dict[str, str] = Field(default_factory=dict)
    requests_per_second: float = Field(default=50.0, gt=0)
    burst: int = Field(default=100, gt=0)

    @field_validator("tokens")
    @classmethod
    def _hashes(cls, value: dict[str, str]) -> dict[str, str]:
        for digest, tenant in value.items():
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(
                    "http.tokens keys must be sha256 hex digests of bearer tokens (see hash_token)"
                )
            validate_id(tenant, "tenant_id")
        return value


class RecallSettings(BaseModel):
    """Compression recall: archive what compaction folds, search it, spend headroom on it."""

    model_config = _STRICT
    enabled: bool = False
    # Auto-recall: windows spend leftover room on the archived passages closest to the intent.
    auto: bool = False
    chunk_size_tokens: int = Field(default=3000, gt=0)
    chunk_overlap_tokens: int = Field(default=300, ge=0)
    auto_passage_tokens: int = Field(default=256, gt=0)
    auto_max_ratio: float = Field(default=0.25, gt=0, le=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.chunk_overlap_tokens >= self.chunk_size_tokens:
            raise ValueError(
                f"chunk_overlap_tokens ({self.chunk_overlap_tokens}) must be below chunk_size_tokens "
                f"({self.chunk_size_tokens})"
            )
        if self.auto and not self.enabled:
            raise ValueError("auto needs enabled: set recall.enabled = true as well")
        if self.enabled:
            try:
                require_fts5("recall.enabled")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return self


class ProxySettings(BaseModel):
    """The OpenAI-compatible proxy's upstream: the agent's model (``model`` is the summariser).

    ``upstream_api_key_env`` is read once at start-up (None: no key is sent)."""

    model_config = _STRICT
    upstream_base_url: str | None = None
    upstream_api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    upstream_timeout: float = Field(default=600.0, gt=0)
    context_window_tokens: dict[str, int] = Field(default_factory=dict)
    default_reserve_tokens: int = Field(default=4096, ge=0)


class TenantSettings(BaseModel):
    """Per-tenant overrides."""

    model_config = _STRICT
    model: ModelSettings | None = None
    # Replaces the global proxy section whole for this tenant's requests.
    proxy: ProxySettings | None = None
    # Replaces the global recall section whole for this tenant's conversations.
    recall: RecallSettings | None = None
    default_budget: int | None = Field(default=None, gt=0)
    requests_per_second: float | None = Field(default=None, gt=0)
    max_conversations: int | None = Field(default=None, gt=0)
    retention_days: int | None = Field(default=None, gt=0)


class WorkerSettings(BaseModel):
    """Celery worker limits and retry policy."""

    model_config = _STRICT
    soft_time_limit: float = Field(default=120.0, gt=0)
    hard_time_limit: float = Field(default=150.0, gt=0)
    concurrency: int = Field(default=2, gt=0)
    lock_timeout: float = Field(default=60.0, gt=0)
    retry_delays: tuple[float, ...] = (2.0, 4.0, 8.0)
    visibility_timeout: int = Field(default=60, gt=0)
    # Circuit breaker per tenant + model endpoint (workers/circuit.py): opens after this many
    # consecutive failed calls, lets one probe call through after ``circuit_reset_seconds``.
    circuit_failure_threshold: int = Field(default=5, gt=0)
    circuit_reset_seconds: float = Field(default=30.0, gt=0)
    # After a job that ended with a failed stage, windows and POST .../compact do not queue
    # the conversation again for this long; it doubles per consecutive failed job up to the
    # maximum and resets on success (a dead endpoint is not hammered).
    failure_backoff_seconds: float = Field(default=30.0, gt=0)
    failure_backoff_max_seconds: float = Field(default=600.0, gt=0)
    # A queued job whose last drain token was sent longer ago than this gets a new one (the
    # reconciler in every worker checks every half of it): no job waits without a token.
    requeue_after_seconds: float = Field(default=30.0, gt=0)
    # The fair scheduler's shards (workers/scheduler.py): tenants hash onto this many rings,
    # each in its own cluster slot, with at most ``ring_tokens`` drain tokens out per ring.
    # Fixed at a deployment's first start (queued jobs would be stranded by a re-mapping).
    scheduler_rings: int = Field(default=16, ge=1, le=256)
    ring_tokens: int = Field(default=2, ge=1)
    # Celery's broker and result backend (None: ``redis.url``). An ``amqp://`` broker
    # (RabbitMQ) gets quorum queues, a delivery limit and a dead-letter queue
    # (docs/reliability.md); the result backend stays a plain Redis.
    broker_url: str | None = None
    result_backend_url: str | None = None
    # RabbitMQ only: a message returned unacknowledged more often than this (e.g. a stage that
    # kills its worker each time) is dead-lettered to ``<prefix>.dead``, not delivered again.
    delivery_limit: int = Field(default=5, ge=1)
    # RabbitMQ only: the broker's ``consumer_timeout`` (seconds; rabbitmq.conf, default 30
    # min). An unacknowledged delivery held longer closes its channel, so it must stay above
    # the longest hold: ``hard_time_limit`` plus the longest retry countdown.
    consumer_timeout: float = Field(default=1800.0, gt=0)

    @field_validator("broker_url", "result_backend_url")
    @classmethod
    def _url_scheme(cls, value: str | None) -> str | None:
        if value is not None and value.split("://", 1)[0].lower() not in _BROKER_SCHEMES:
            # Never echo the value: it may carry a password.
            scheme = value.split("://", 1)[0] if "://" in value else "(none)"
            raise ValueError(
                f"scheme {scheme!r} is not one of {', '.join(_BROKER_SCHEMES)} "
                "(e.g. amqp://user:password@host:5672//)"
            )
        return value

    @model_validator(mode="after")
    def _limits(self) -> Self:
        if self.soft_time_limit >= self.hard_time_limit:
            raise ValueError("worker.soft_time_limit must be below worker.hard_time_limit")
        # Retry delays are jittered by up to +20% (workers/tasks.py) and rounded up to whole
        # seconds on RabbitMQ's delayed delivery.
        longest = self.hard_time_limit + math.ceil(max(self.retry_delays, default=1.0) * 1.2)
        if self.consumer_timeout <= longest:
            raise ValueError(
                f"worker.consumer_timeout ({self.consumer_timeout:g} s) must be above "
                f"worker.hard_time_limit plus the longest retry countdown ({longest:g} s)"
            )
        if self.failure_backoff_max_seconds < self.failure_backoff_seconds:
            raise ValueError("worker.failure_backoff_max_seconds must be >= worker.failure_backoff_seconds")
        return self


class Settings(BaseModel):
    """The whole configuration tree."""

    model_config = _STRICT
    redis: RedisSettings = Field(default_factory=RedisSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    recall: RecallSettings = Field(default_factory=RecallSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)

    @field_validator("tenants")
    @classmethod
    def _tenant_ids(cls, value: dict[str, TenantSettings]) -> dict[str, TenantSettings]:
        for tenant in value:
            validate_id(tenant, "tenant_id")
        return value

    def tenant(self, tenant_id: str) -> TenantSettings:
        """Overrides of one tenant (empty when none are configured)."""
        return self.tenants.get(tenant_id) or TenantSettings()

    def recall_for_tenant(self, tenant_id: str) -> RecallSettings:
        """A tenant's recall settings (its own section, else the global one)."""
        return self.tenant(tenant_id).recall or self.recall

    def model_for_tenant(self, tenant_id: str) -> ModelSettings:
        """The model a tenant's conversations are summarised with."""
        return self.tenant(tenant_id).model or self.model

    def proxy_for_tenant(self, tenant_id: str) -> ProxySettings:
        """The proxy settings of a tenant's requests (its own section, else the global one)."""
        return self.tenant(tenant_id).proxy or self.proxy

    def budget_for_tenant(self, tenant_id: str) -> int:
        """A tenant's default budget."""
        return self.tenant(tenant_id).default_budget or self.service.default_budget

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Settings:
        """Validate a mapping; errors become ``ConfigError`` naming every bad field."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"invalid settings: {problems}") from exc

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Settings:
        """Settings from a TOML file alone."""
        return cls.load(_read_toml(Path(path)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, config_file: str | None = None) -> Settings:
        """Settings from the TOML file (if any) overlaid with ``CTXCORE_*`` variables."""
        env = os.environ if environ is None else environ
        path = config_file or env.get("CTXCORE_CONFIG_FILE")
        data: dict[str, Any] = _read_toml(Path(path)) if path else {}
        for name, value in sorted(env.items()):
            if name in _ALIASES:
                _set(data, _ALIASES[name], value)
            elif name.startswith(ENV_PREFIX) and "__" in name:
                parts = tuple(p.lower() for p in name[len(ENV_PREFIX) :].split("__"))
                if parts[0] == "tenants" and len(parts) >= 2:
                    # Tenant ids keep their case.
                    raw = name[len(ENV_PREFIX) :].split("__")
                    parts = ("tenants", raw[1], *(p.lower() for p in raw[2:]))
                _set(data, parts, value)
        return cls.load(data)


def environment_variables() -> list[tuple[str, str]]:
    """Every ``CTXCORE_*`` variable ``from_env`` reads, with its default as shown to a user:
    each leaf of the ``Settings`` tree as ``CTXCORE_<SECTION>__<KEY>`` (``<ID>`` stands for a
    tenant id; a tenant's null values and missing ``MODEL__*`` keys mean the global settings
    apply), then the short aliases and ``CTXCORE_CONFIG_FILE``. Generated from the model, so
    ``--help`` cannot drift from it."""
    out: list[tuple[str, str]] = []
    _leaves(Settings, ENV_PREFIX.rstrip("_"), out)
    for alias, path in _ALIASES.items():
        out.append((alias, f"alias of {ENV_PREFIX}{'__'.join(path).upper()}"))
    out.append(("CTXCORE_CONFIG_FILE", "TOML settings file read before the variables (default: none)"))
    return out


def _leaves(model: type[BaseModel], name: str, out: list[tuple[str, str]]) -> None:
    for field_name, info in model.model_fields.items():
        path = f"{name}{'_' if name == ENV_PREFIX.rstrip('_') else '__'}{field_name.upper()}"
        args: tuple[Any, ...] = getattr(info.annotation, "__args__", ())
        if getattr(info.annotation, "__origin__", None) is dict and len(args) == 2 and _model_of(args[1]):
            _leaves(_model_of(args[1]) or model, f"{path}__<ID>", out)
        elif section := _model_of(info.annotation):
            _leaves(section, path, out)
        else:
            default = info.get_default(call_default_factory=True)
            out.append((path, default if isinstance(default, str) else json.dumps(default)))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings section an annotation holds (``X`` or ``X | None``), else None."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _parse(value: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, ValueError):
        return value


def _set(data: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"environment sets {'.'.join(path)} but {part} is not a section")
        node = child
    node[path[-1]] = _parse(value)
