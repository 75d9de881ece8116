"""The Celery app: ``celery -A workers.app worker`` or ``ctxcore worker``.

Importing this module reads no environment and opens no connection; the defaults point
at ``redis://127.0.0.1:6379/0``. The CLI (or the worker's start-up when launched by the
``celery`` command) applies ``Settings`` with ``configure``.

Crash safety (see README, "Distributed compaction"): tasks are acknowledged late and
rejected when their worker is lost, so a killed worker's task is redelivered; with Redis as
broker an unacknowledged message comes back after ``visibility_timeout``, and the restore
scan runs every ``unacked_restore_interval`` seconds (kombu's default of 10 x 10 s made a
killed worker's task wait about 90 s). Stage tasks are idempotent: a redelivered stage
whose planned version is stale re-plans instead of writing twice.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery
from celery.signals import celeryd_init, worker_process_init

from ctxcore.config import Settings

__all__ = ["JOBS_QUEUE", "STAGES_QUEUE", "app", "configure", "runtime"]

JOBS_QUEUE = "ctxcore.jobs"
STAGES_QUEUE = "ctxcore.stages"
DEFAULT_URL = "redis://127.0.0.1:6379/0"

app = Celery("ctxcore", include=["workers.tasks"])


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from ``Settings``."""
    worker = settings.worker
    # Every Celery and kombu key (queues, bindings, unacked, results) lives under the same
    # prefix as ctxcore's own keys: one deployment (or one demo or test run) is found and
    # removed by a SCAN on its prefix and never touches another's.
    key_prefix = settings.redis.key_prefix
    return {
        "broker_url": settings.redis.url,
        "result_backend": settings.redis.url,
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
            "global_keyprefix": f"{key_prefix}:",
        },
        "result_backend_transport_options": {"global_keyprefix": f"{key_prefix}:"},
        "broker_connection_retry_on_startup": True,
        "task_default_queue": JOBS_QUEUE,
        "task_routes": {"ctxcore.stage.*": {"queue": STAGES_QUEUE}},
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "result_expires": 3600,
        "worker_hijack_root_logger": False,
    }


app.conf.update(celery_config(Settings()))
_state: dict[str, Any] = {"settings": None, "runtime": None}


def configure(settings: Settings, celery_app: Celery = app) -> Celery:
    """Apply ``settings`` to the app and remember them for the tasks' runtime."""
    celery_app.conf.update(celery_config(settings))
    # Connections and the result backend are cached on first use: drop them so a new broker
    # URL takes effect in a process that already talked to another one.
    celery_app._pool = None
    amqp = celery_app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
    celery_app._backend_cache = None
    celery_app._local = threading.local()
    _state["settings"] = settings
    _state["runtime"] = None
    return celery_app


def runtime() -> Any:
    """The process's ``Runtime`` (built on first use, after the worker forked)."""
    from workers.runtime import Runtime

    rt = _state["runtime"]
    if rt is None:
        settings = _state["settings"]
        if settings is None:
            # Started by the celery command rather than ``ctxcore worker``: this is the
            # worker's start-up, the one place besides the CLI that reads the environment.
            settings = Settings.from_env()
            configure(settings)
        rt = _state["runtime"] = Runtime(settings)
    return rt


@celeryd_init.connect
def _settings_from_env(**_: Any) -> None:
    # Worker start-up through the celery command: read CTXCORE_* once, before connecting.
    if _state["settings"] is None:
        configure(Settings.from_env())


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    # A forked child must not share the parent's Redis sockets.
    _state["runtime"] = None
