"""The ``worker`` section: Celery, the broker, retries, the scheduler and the circuit breaker."""

from __future__ import annotations

import math
from typing import Self

from pydantic import BaseModel, Field, field_validator, model_validator

from ctxcore.config.base import STRICT
from ctxcore.errors import ConfigError

__all__ = ["FlowerSettings", "WorkerSettings"]

_BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp")


class WorkerSettings(BaseModel):
    """Celery worker limits and retry policy."""

    model_config = STRICT
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
    # A job whose stages saved nothing while the view stayed over its target pauses the
    # conversation (``paused``, reason ``no_progress``): windows start no job until the log
    # grows by a step and 5% of the budget, the budget asked for changes, or this long passes.
    no_progress_backoff_seconds: float = Field(default=600.0, gt=0)
    # A queued job whose last drain token was sent longer ago than this gets a new one (the
    # reconciler in every worker checks every half of it): no job waits without a token.
    requeue_after_seconds: float = Field(default=30.0, gt=0)
    # A running stage writes a heartbeat this often (and a stage sent or waiting for its
    # retry countdown counts as alive until it is due); a running job with neither for twice
    # this long lost its stage (e.g. a retry that could not be published while Redis was
    # down): the reconciler queues it again and the conversation shows ``failing`` with
    # ``lost_task`` until the job runs again. At most ``hard_time_limit``; unset: 10 s, or
    # half of ``hard_time_limit`` when that is shorter (``workers.heartbeat.heartbeat_interval``).
    heartbeat_seconds: float | None = Field(default=None, gt=0)
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
    # Each worker node serves its Prometheus metrics (stage durations, failures; summed over
    # its pool processes) on this port; 0 serves none. A drain node next to a stages node
    # (``--node all``) uses the next port. A node whose port is taken (another worker on
    # this host) takes the next free one of its kind: every second port, so a stages node
    # never takes a drain node's; ``metrics_port_tries`` ports of its kind are tried, and
    # with all of them taken the worker starts without metrics (logged at ERROR).
    metrics_port: int = Field(default=9808, ge=0, le=65534)
    metrics_port_tries: int = Field(default=8, ge=1, le=64)
    # The address the metrics listen on: this host only by default, like the API;
    # "0.0.0.0" (or "::") serves every interface, e.g. a container's published port.
    metrics_host: str = Field(default="127.0.0.1", min_length=1)

    @field_validator("broker_url", "result_backend_url")
    @classmethod
    def _url_scheme(cls, value: str | None) -> str | None:
        if value is not None and value.split("://", 1)[0].lower() not in _BROKER_SCHEMES:
            # Never echo the value: it may carry a password.
            scheme = value.split("://", 1)[0] if "://" in value else "(none)"
            raise ConfigError(
                f"scheme {scheme!r} is not one of {', '.join(_BROKER_SCHEMES)} "
                "(e.g. amqp://user:password@host:5672//)"
            )
        return value

    @model_validator(mode="after")
    def _limits(self) -> Self:
        if self.soft_time_limit >= self.hard_time_limit:
            raise ConfigError("worker.soft_time_limit must be below worker.hard_time_limit")
        # Retry delays are jittered by up to +20% (workers/stage_retry.py) and rounded up to whole
        # seconds on RabbitMQ's delayed delivery.
        longest = self.hard_time_limit + math.ceil(max(self.retry_delays, default=1.0) * 1.2)
        if self.consumer_timeout <= longest:
            raise ConfigError(
                f"worker.consumer_timeout ({self.consumer_timeout:g} s) must be above "
                f"worker.hard_time_limit plus the longest retry countdown ({longest:g} s)"
            )
        if self.heartbeat_seconds is not None and self.heartbeat_seconds > self.hard_time_limit:
            raise ConfigError(
                f"worker.heartbeat_seconds ({self.heartbeat_seconds:g} s) must not be longer than "
                f"worker.hard_time_limit ({self.hard_time_limit:g} s): a stage would end before "
                "its first heartbeat"
            )
        if self.failure_backoff_max_seconds < self.failure_backoff_seconds:
            raise ConfigError("worker.failure_backoff_max_seconds must be >= worker.failure_backoff_seconds")
        return self


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


class FlowerSettings(BaseModel):
    """``ctxcore flower``: where Flower listens and who may read it.

    Flower shows every task's arguments, results and failures: it binds the loopback
    interface unless ``host`` says otherwise, and binding anything else requires
    ``basic_auth`` (``user:password`` entries, a list or one comma-separated string).
    """

    model_config = STRICT
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=5555, ge=1, le=65535)
    basic_auth: tuple[str, ...] = ()

    @field_validator("basic_auth", mode="before")
    @classmethod
    def _credentials(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        for entry in value if isinstance(value, list | tuple) else ():
            user, sep, password = entry.partition(":") if isinstance(entry, str) else ("", "", "")
            if not sep or not user or not password or any(c in entry for c in ", \t\n"):
                raise ConfigError(
                    "flower.basic_auth entries must be user:password (a non-empty user without ':', "
                    "a non-empty password, no spaces or commas)"
                )
        return value

    @property
    def loopback(self) -> bool:
        """True when Flower listens on this machine only."""
        return self.host in _LOOPBACK
