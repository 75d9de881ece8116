"""The Celery app: ``celery -A workers.app worker`` or ``ctxcore worker``.

Importing this module configures nothing, reads no environment and opens no connection:
``configure(settings)`` is called at start-up, by the CLI's commands, by the HTTP app, or
(a worker launched by the ``celery`` command) by ``celeryd_init`` from the environment.

Crash safety (see README, "Distributed compaction"): tasks are acknowledged late and
rejected when their worker is lost, so a killed worker's task is redelivered; with Redis as
broker an unacknowledged message comes back after ``visibility_timeout``, and the restore
scan runs every ``unacked_restore_interval`` seconds (kombu's default of 10 x 10 s made a
killed worker's task wait about 90 s); with RabbitMQ (``worker.broker_url`` ``amqp://``)
it comes back when the dead worker's connection closes (``workers.broker``). Stage tasks are idempotent: a redelivered stage
whose planned version is stale re-plans instead of writing twice.

Deployments sharing one Redis database are isolated by ``redis.key_prefix``: queues are
``<prefix>.jobs`` / ``<prefix>.stages``, the control and event exchanges
``<prefix>.control`` / ``<prefix>.events``, and kombu's and the result backend's own keys
(``unacked``, ``_kombu.binding.*``, ``celery-task-meta-*``) get ``<prefix>:`` in front
(``global_keyprefix``). Every worker also runs the scheduler's reconciler
(``workers.reconciler``, in ``include``: it adds itself to the worker's bootsteps) as a
bootstep timer.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)

from ctxcore.config import ModelSettings, Settings
from workers.broker import QueueNames, amqp_queues, broker_url, queue_names, result_backend_url, uses_amqp
from workers.logs import JsonFormatter, TaskJsonFormatter, apply_log_format

if TYPE_CHECKING:
    from workers.runtime import Runtime

__all__ = ["QueueNames", "app", "celery_config", "configure", "queue_names", "runtime", "settings"]

app = Celery("ctxcore", include=["workers.tasks", "workers.reconciler", "workers.celery_tracing"])


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from ``Settings``."""
    worker = settings.worker
    # Every Celery and kombu key (queues, bindings, unacked, results) lives under the same
    # prefix as ctxcore's own keys: one deployment (or one demo or test run) is found and
    # removed by a SCAN on its prefix and never touches another's.
    prefix = settings.redis.key_prefix
    queues = queue_names(settings)
    config: dict[str, Any] = {
        "broker_url": broker_url(settings),
        "result_backend": result_backend_url(settings),
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_soft_time_limit": worker.soft_time_limit,
        "task_time_limit": worker.hard_time_limit,
        "broker_transport_options": {
            "visibility_timeout": worker.visibility_timeout,
            "unacked_restore_interval": 2,
            "unacked_restore_throttle": 1,
            # Workers drain continuation stages before starting new jobs.
            "queue_order_strategy": "priority",
            "global_keyprefix": f"{prefix}:",
        },
        "result_backend_transport_options": {"global_keyprefix": f"{prefix}:"},
        "broker_connection_retry_on_startup": True,
        "task_default_queue": queues.jobs,
        "task_queues": None,
        "task_routes": {"ctxcore.stage.*": {"queue": queues.stages}},
        "control_exchange": f"{prefix}.control",
        "event_exchange": f"{prefix}.events",
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "result_expires": 3600,
        "worker_hijack_root_logger": False,
    }
    if uses_amqp(settings):
        # RabbitMQ (docs/reliability.md): quorum queues with a delivery limit and a
        # dead-letter queue; Celery's quorum detection turns global QoS off and sends a
        # countdown through native delayed delivery (quorum queues have no ETA holding).
        # Publisher confirms: a send returns once the broker has the message.
        config.update(
            task_queues=amqp_queues(settings),
            worker_detect_quorum_queues=True,
            broker_native_delayed_delivery_queue_type="quorum",
            broker_transport_options={"confirm_publish": True},
        )
    return config


@dataclass
class _AppState:
    """What ``configure`` applied, and the process's runtime built from it."""

    settings: Settings | None = None
    runtime: Runtime | None = None


_state = _AppState()


def configure(settings: Settings, celery_app: Celery = app) -> Celery:
    """Apply ``settings`` to the app and remember them for the tasks' runtime."""
    celery_app.conf.update(celery_config(settings))
    _drop_cached_connections(celery_app)
    _state.settings = settings
    _state.runtime = None
    return celery_app


def _drop_cached_connections(celery_app: Celery) -> None:
    """Forget what the app built from its previous configuration, so a new broker URL takes
    effect in a process that already talked to another one (tests, ``ctxcore demo``).

    Celery has no public reset: ``close()`` drops the pool but also deregisters the app, and
    ``_after_fork`` keeps the backend. So this resets the attributes Celery 5's
    ``app/base.py`` caches them in; the stubs (celery-types) do not declare them."""
    # The broker connection pool and the result backend (thread-local unless thread-safe).
    celery_app._pool = None  # type: ignore[attr-defined]  # private: see the docstring
    celery_app._backend_cache = None  # type: ignore[attr-defined]  # private: see the docstring
    celery_app._local = threading.local()  # type: ignore[attr-defined]  # private: see the docstring
    # The queues, router and producer pool (amqp), the control mailbox (exchange name) and
    # the event helpers are cached properties built on first use: rebuild them too.
    for cached in ("amqp", "control", "events"):
        celery_app.__dict__.pop(cached, None)


def settings() -> Settings:
    """The settings the app was configured with (from the environment when it was not)."""
    current = _state.settings
    if current is None:
        # Started by the celery command rather than ``ctxcore worker``: this is the
        # worker's start-up, the one place besides the CLI that reads the environment.
        current = Settings.from_env()
        configure(current)
    return current


def runtime() -> Runtime:
    """The process's ``Runtime`` (built on first use, after the worker forked)."""
    from workers.runtime import Runtime

    rt = _state.runtime
    if rt is None:
        rt = _state.runtime = Runtime(settings())
    return rt


@celeryd_init.connect
def _settings_from_env(**_: Any) -> None:
    # Worker start-up through the celery command: read CTXCORE_* once, before connecting.
    if _state.settings is None:
        configure(Settings.from_env())


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    # A forked child must not share the parent's Redis sockets.
    _state.runtime = None


@worker_process_shutdown.connect
def _metrics_files_dead(pid: int | None = None, **_: Any) -> None:
    # A pool child exits: prometheus-client's multiprocess mode drops its live-gauge files.
    from workers.prom_worker import mark_process_dead

    mark_process_dead(pid or os.getpid())


@after_setup_logger.connect
def _json_logs(logger: logging.Logger, **_: Any) -> None:
    # Celery installed its handlers on the root logger: ``logging.format`` picks their format
    # (the settings are applied by now: ``ctxcore worker``, else ``celeryd_init``).
    if _state.settings is not None:
        apply_log_format(_state.settings, [logger], JsonFormatter)


@after_setup_task_logger.connect
def _json_task_logs(logger: logging.Logger, **_: Any) -> None:
    if _state.settings is not None:
        apply_log_format(_state.settings, [logger], TaskJsonFormatter)


def summariser_description(settings: Settings) -> str:
    """What summarises this deployment's conversations, for the worker's start-up line: the
    offline ``ExtractiveModel`` when ``model.base_url`` is unset (whatever model endpoint
    the agents use), else the model and its endpoint (never credentials)."""
    from workers.failures import public_endpoint

    def one(cfg: ModelSettings) -> str:
        if cfg.base_url is None:
            return "the offline ExtractiveModel (model.base_url is unset: CTXCORE_MODEL_BASE_URL)"
        return f"{cfg.name} at {public_endpoint(cfg.base_url)}"

    text = f"summarising with {one(settings.model)}"
    own = sorted(t for t, tenant in settings.tenants.items() if tenant.model is not None)
    if own:
        text += "; tenants with a model of their own: " + ", ".join(
            f"{t} ({one(m)})" for t in own if (m := settings.tenants[t].model) is not None
        )
    return text


@worker_ready.connect
def _say_what_summarises(**_: Any) -> None:
    # A worker without a model endpoint still compacts, extractively: say so at start-up.
    if _state.settings is not None:
        logging.getLogger("ctxcore.worker").info(
            "ctxcore worker: %s", summariser_description(_state.settings)
        )
