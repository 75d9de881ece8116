"""Wiring: stores, coordinator, scheduler, service and usage built from ``Settings``.

One ``Runtime`` per process (built after a worker forks): it owns the Redis connection
pool and, when ``database.url`` is set, the SQL engine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar

import redis

from ctxcore.config import ModelSettings, Settings
from ctxcore.coordinator import Coordinator
from ctxcore.errors import ConfigError, StoreUnavailable
from ctxcore.pipeline.fitting import CallLimits, check_context_window, check_output_cap
from ctxcore.recall.archive import ChunkingConfig
from ctxcore.state import ConversationKey, MessageLog, OffloadStore, StateStore
from ctxcore.state.journal import StageJournal
from ctxcore.state.redis.retention import RedisRetention
from ctxcore.state.retention import Retention
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import ModelClient
from ctxcore.summarize.openai_chat import OpenAIChatModel
from ctxcore.telemetry import Tracer
from ctxcore.tokens import TiktokenCounter, TokenCounter
from ctxcore.turns import UserDetector
from workers.broker import check_broker
from workers.circuit import CircuitBreaker, CircuitBreakerClient
from workers.failures import FailureStore
from workers.heartbeat import heartbeat_interval
from workers.prom_worker import stage_metrics
from workers.redis_clients import redis_client, settings_client
from workers.scheduler import FairScheduler
from workers.scrubbing import deployment_secrets
from workers.service import CompactionQueue, ContextService
from workers.spend import BudgetedModel, SummariserBudget, summariser_cap
from workers.telemetry import build_tracer, check_telemetry
from workers.telemetry.jobs import JobTraces
from workers.telemetry.model import TracedModel
from workers.usage import Usage

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ctxcore.state.sql.engine import SqlBackend

__all__ = ["Runtime", "check_startup", "redis_client", "retention_of"]

log = logging.getLogger(__name__)
SqlStore = TypeVar("SqlStore", bound="SqlBackend")


def retention_of(settings: Settings) -> Retention:
    """``service.retention_days`` and the tenants' overrides, in the stores' terms (seconds),
    with the offloads' own TTL (``service.offload_ttl_seconds``)."""
    return Retention.from_days(
        settings.service.retention_days,
        {tenant: t.retention_days for tenant, t in settings.tenants.items()},
        offload_ttl_seconds=settings.service.offload_ttl_seconds,
    )


@dataclass
class Runtime:
    """Everything a worker or API process needs, built lazily from ``settings``."""

    settings: Settings
    counter: TokenCounter = field(default_factory=TiktokenCounter)
    _models: dict[str, ModelClient] = field(default_factory=dict)

    @cached_property
    def redis(self) -> redis.Redis:
        """The process's client for ctxcore's keys: one ``RedisCluster`` when
        ``redis.cluster_nodes`` is set, else a plain Redis on ``redis.url``."""
        return settings_client(self.settings.redis)

    @cached_property
    def secrets(self) -> tuple[str, ...]:
        """The deployment's secret values (``workers.scrubbing.deployment_secrets``), read
        from the environment once: what no failure text may carry out of the process."""
        return deployment_secrets(self.settings)

    @cached_property
    def retention(self) -> Retention:
        """How long idle conversations are kept (``retention_of``)."""
        return retention_of(self.settings)

    @cached_property
    def sql_engine(self) -> Engine:
        """The SQL stores' engine (``database.url``)."""
        from sqlalchemy import create_engine

        url = self.settings.database.url
        if url is None:
            raise ConfigError("database.url is not set: set it in the settings to use the SQL stores")
        return create_engine(url, pool_pre_ping=True)

    def _sql_store(self, cls: type[SqlStore]) -> SqlStore:
        """A SQL store of ``cls`` on the process's engine, its tables set up."""
        store = cls(engine=self.sql_engine, table_prefix=self.settings.database.table_prefix)
        store.setup()
        return store

    @cached_property
    def state_store(self) -> StateStore:
        """Compaction state: SQL when configured, else Redis."""
        if self.settings.database.url:
            from ctxcore.state.sql import SqlStateStore

            return self._sql_store(SqlStateStore)
        from ctxcore.state.redis import RedisStateStore

        return RedisStateStore(self.redis, prefix=self.settings.redis.key_prefix, retention=self.retention)

    @cached_property
    def log(self) -> MessageLog:
        """The raw message log."""
        if self.settings.database.url:
            from ctxcore.state.sql.log import SqlMessageLog

            return self._sql_store(SqlMessageLog)
        from ctxcore.state.redis import RedisMessageLog

        return RedisMessageLog(self.redis, prefix=self.settings.redis.key_prefix, retention=self.retention)

    @cached_property
    def offloads(self) -> OffloadStore:
        """Offloaded originals."""
        if self.settings.database.url:
            from ctxcore.state.sql import SqlOffloadStore

            return self._sql_store(SqlOffloadStore)
        from ctxcore.state.redis import RedisOffloadStore

        return RedisOffloadStore(
            self.redis,
            prefix=self.settings.redis.key_prefix,
            ttl_seconds=self.settings.service.offload_ttl_seconds,
            retention=self.retention,
        )

    @cached_property
    def journal(self) -> StageJournal:
        """Each conversation's stage journal (``ctxcore.state.journal``), beside its state:
        SQL when configured, else Redis."""
        if self.settings.database.url:
            from ctxcore.state.sql.journal import SqlStageJournal

            return self._sql_store(SqlStageJournal)
        from ctxcore.state.redis.journal import RedisStageJournal

        return RedisStageJournal(self.redis, prefix=self.settings.redis.key_prefix, retention=self.retention)

    @cached_property
    def detector(self) -> UserDetector:
        """Real-user detection with the configured extra prefixes."""
        return self.settings.engine.detector()

    def model_for(self, key: ConversationKey) -> ModelClient:
        """The tenant's summarisation model (cached per configuration).

        A remote endpoint is called through the tenant's circuit breaker (shared in Redis by
        every worker); the offline ``ExtractiveModel`` cannot fail that way and is not wrapped.
        Every call is reserved on the tenant's daily summariser budget first (``workers.spend``).
        """
        cfg = self.settings.model_for_tenant(key.tenant_id)
        cache_key = cfg.model_dump_json()
        client = self._models.get(cache_key)
        if client is None:
            client = self._models.setdefault(cache_key, build_model(cfg, self.counter))
        if cfg.base_url is not None:
            client = CircuitBreakerClient(
                client,
                self.circuit,
                key.tenant_id,
                cfg.base_url,
                on_refused=lambda: stage_metrics().circuit_open.inc(),
            )
        # Outermost: a call refused by the tenant's cap never reaches the breaker or the endpoint.
        cap = summariser_cap(self.settings, key.tenant_id)
        budgeted = BudgetedModel(client, self.spend, key.tenant_id, self.counter, cap)
        # Outside the cap: a call the cap refuses is a failed span too (no endpoint reached).
        kind = "openai" if cfg.base_url is not None else "ctxcore.extractive"
        return TracedModel(budgeted, self.tracer, kind) if self.tracer.enabled else budgeted

    @cached_property
    def tracer(self) -> Tracer:
        """The process's tracer (``workers.telemetry.build_tracer``): ``NO_TRACER`` while
        ``telemetry`` is off. Tests assign one over an in-memory exporter."""
        return build_tracer(self.settings.telemetry)

    @cached_property
    def job_traces(self) -> JobTraces:
        """Where window requests leave their trace context for the job they queue."""
        return JobTraces(self.redis, self.settings.redis.key_prefix, self.settings.telemetry)

    @cached_property
    def spend(self) -> SummariserBudget:
        """The tenants' daily summariser counters (``workers.spend``)."""
        return SummariserBudget(
            self.redis,
            prefix=self.settings.redis.key_prefix,
            on_settled=lambda tenant, tokens: stage_metrics().summariser_tokens.labels(tenant).inc(tokens),
        )

    @cached_property
    def circuit(self) -> CircuitBreaker:
        """The model endpoints' circuit breaker (state in Redis, shared by all workers)."""
        worker = self.settings.worker
        return CircuitBreaker(
            self.redis,
            prefix=self.settings.redis.key_prefix,
            failure_threshold=worker.circuit_failure_threshold,
            reset_seconds=worker.circuit_reset_seconds,
        )

    @cached_property
    def coordinator(self) -> Coordinator:
        """The state's only writer."""
        service = self.settings.service
        return Coordinator(
            self.state_store,
            self.log,
            self.counter,
            self.model_for,
            trigger_ratio=service.trigger_ratio,
            target_ratio=service.target_ratio,
            default_budget=service.default_budget,
            keep_recent_messages=self.settings.engine.keep_recent_messages,
            detector=self.detector,
            max_result_ratio=self.settings.engine.result_cap_ratio,
            recall_for=self.chunking_for,
            call_limits_for=self.call_limits_for,
        )

    def call_limits_for(self, key: ConversationKey) -> CallLimits:
        """The context and output cap ``key``'s summariser calls are fitted to."""
        return CallLimits.of(self.settings.model_for_tenant(key.tenant_id))

    def chunking_for(self, key: ConversationKey) -> ChunkingConfig | None:
        """How ``key``'s compactions archive for recall (None: recall off for its tenant)."""
        recall = self.settings.recall_for_tenant(key.tenant_id)
        sizes = (recall.chunk_size_tokens, recall.chunk_overlap_tokens, recall.auto_passage_tokens)
        return ChunkingConfig(*sizes) if recall.enabled else None

    @cached_property
    def scheduler(self) -> FairScheduler:
        """The fair, coalescing job queue."""
        worker = self.settings.worker
        return FairScheduler(
            self.redis,
            prefix=self.settings.redis.key_prefix,
            lease_seconds=worker.hard_time_limit * 4,
            requeue_after_seconds=worker.requeue_after_seconds,
            rings=worker.scheduler_rings,
            ring_tokens=worker.ring_tokens,
            mirror=self.failures.key,
            retention=RedisRetention(self.redis, self.settings.redis.key_prefix, self.retention),
            liveness_seconds=2 * heartbeat_interval(worker),
            on_request=lambda key: self.job_traces.noted(key, self.tracer),
        )

    @cached_property
    def failures(self) -> FailureStore:
        """Each conversation's last error, last success and failure backoff."""
        worker = self.settings.worker
        return FailureStore(
            self.redis,
            prefix=self.settings.redis.key_prefix,
            backoff_seconds=worker.failure_backoff_seconds,
            backoff_max_seconds=worker.failure_backoff_max_seconds,
            retention=self.retention,
        )

    @cached_property
    def usage(self) -> Usage:
        """Summariser usage per tenant (``GET /v1/usage``), shared in Redis by every process."""
        return Usage(self.redis, prefix=self.settings.redis.key_prefix)


def check_startup(settings: Settings) -> None:
    """Fail a worker's or the API's start with ``ConfigError`` on a misconfigured Redis: a
    cluster node as ``redis.url``, a cluster without full slot coverage, or a
    ``worker.scheduler_rings`` other than the deployment's. Redis not answering yet is only
    logged: the process starts and meets the outage as ``StoreUnavailable``. An AMQP broker
    that refuses the login fails it too, naming the host (``workers.broker.check_broker``),
    and so does telemetry on without the ``ctxcore[otel]`` extra."""
    check_broker(settings)
    check_telemetry(settings.telemetry)
    rt = Runtime(settings)
    check_model_contexts(settings, rt.counter)
    try:
        rt.scheduler.check()
    except StoreUnavailable as exc:
        log.warning("Redis not reachable at start-up (%s); the start-up checks run at first use", exc)
        return
    rt.redis.close()


def check_model_contexts(settings: Settings, counter: TokenCounter) -> None:
    """Refuse (``ConfigError`` with the sizes) a ``model.context_window_tokens``, global or a
    tenant's, too small for the smallest summariser call, and an endpoint's ``max_tokens``
    too small for the smallest summary: better at start-up than as every stage failing later."""
    scoped = [("model", settings.model)] + [
        (f"tenants.{tenant}.model", t.model) for tenant, t in settings.tenants.items() if t.model is not None
    ]
    for where, model in scoped:
        check_context_window(model.context_window_tokens, counter, f"{where}.context_window_tokens")
        if not model.offline:
            check_output_cap(model.max_tokens, counter, f"{where}.max_tokens")


def build_model(cfg: ModelSettings, counter: TokenCounter) -> ModelClient:
    """``ExtractiveModel`` when no endpoint is configured, else an OpenAI-compatible client."""
    if cfg.base_url is None:
        return ExtractiveModel(counter)
    return OpenAIChatModel(
        base_url=cfg.base_url,
        api_key=os.environ.get(cfg.api_key_env),
        model=cfg.name,
        timeout=cfg.timeout,
        timeout_per_output_token=cfg.timeout_per_output_token,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
    )


def build_service(runtime: Runtime, queue: CompactionQueue) -> ContextService:
    """A ``ContextService`` over the runtime's stores and ``queue``."""
    return ContextService(
        runtime.settings,
        runtime.state_store,
        runtime.log,
        runtime.offloads,
        queue,
        counter=runtime.counter,
        detector=runtime.detector,
        failures=runtime.failures,
    )
