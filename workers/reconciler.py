"""The scheduler's reconciler: no queued job waits without a drain token.

A queued job only starts when a drain token reaches a worker, and a token can be lost: its
send failed, or a consumer took it and did nothing with it. Every worker runs this
reconciler as a bootstep timer (no extra process, unlike Celery beat) every
``worker.requeue_after_seconds / 2``: one Lua call per ring (``FairScheduler.stuck_rings``)
finds the rings with jobs whose tokens were neither sent nor consumed for
``requeue_after_seconds``, re-stamps them and returns one token for each, so N
workers revive a ring once per interval.

Tokens still waiting in the jobs queue may stand for stuck rings (a backlog that outlasts
``requeue_after_seconds`` is not a loss): only the difference is sent, which keeps a long
backlog from piling up tokens. But a token starts a job of its own ring while that ring has
jobs (an empty ring's scans onward and may find a busy ring first), so the tokens out for
the rings that are not stuck are taken off the waiting count first. (Subtracting every waiting token starved a ring whose token
died with a killed worker for as long as a busy ring kept its tokens in the queue.) On RabbitMQ each pass also logs the dead letters not reported before
(``workers.dead_letters``). The step registers itself on the app when this module is
imported: it is in the app's ``include``, which a worker imports before it builds its
bootsteps, so the app never imports this module (nor, through it, ``workers.jobs``).

Each pass also queues again the running jobs that lost their stage (no heartbeat and no
pending stage for ``2 x worker.heartbeat_seconds``: ``workers.lost_jobs``).

With a retention (``service.retention_days`` or a tenant's) the step also runs the retention
sweep (``workers.retention``) every ``SWEEP_EVERY_SECONDS``, one worker per interval.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import bootsteps
from kombu.exceptions import OperationalError

from ctxcore.config import Settings
from ctxcore.errors import StoreUnavailable
from workers.app import app, runtime, settings
from workers.broker import declare_queues, queue_names, uses_amqp
from workers.broker_queues import broker_channel, queue_ready
from workers.dead_letters import report_dead_letters
from workers.jobs import send_drain_tokens
from workers.lost_jobs import requeue_lost_jobs
from workers.retention import SWEEP_EVERY_SECONDS, sweep_if_due
from workers.runtime import Runtime, retention_of

__all__ = ["Reconciler", "reconcile", "reconcile_once"]

log = logging.getLogger(__name__)


def _waiting_tokens(current: Settings) -> int:
    """Messages waiting in the jobs queue (kombu counts every priority level)."""
    return queue_ready(queue_names(current).jobs, amqp=uses_amqp(current))


def _report_dead_letters(rt: Runtime) -> None:
    """On RabbitMQ, log each new dead letter at ERROR (``workers.dead_letters``)."""
    try:
        report_dead_letters(rt.settings, rt.redis)
    except (StoreUnavailable, OperationalError, OSError, redis.RedisError) as exc:
        log.warning("reconciler: dead letters not read (%s); trying again next pass", exc)


def reconcile_once() -> int:
    """Send drain tokens for queued jobs that waited too long without one; returns how many."""
    return reconcile(runtime())


def reconcile(rt: Runtime) -> int:
    """``reconcile_once`` over ``rt`` (the worker's timer passes the process's runtime)."""
    wait = rt.settings.worker.requeue_after_seconds
    _report_dead_letters(rt)
    requeue_lost_jobs(rt)
    try:
        stuck, others_out = rt.scheduler.reconcile_scan()
        if not stuck:
            return 0
        missing = sum(stuck.values()) - max(0, _waiting_tokens(rt.settings) - others_out)
    except (StoreUnavailable, OperationalError, OSError) as exc:
        log.warning("reconciler: Redis or the broker unavailable (%s); trying again in %.0f s", exc, wait / 2)
        return 0
    sent = 0
    for ring, count in sorted(stuck.items()):
        if sent >= missing:
            break
        sent += send_drain_tokens(min(count, missing - sent), ring)
    log.warning(
        "reconciler: %d ring(s) with queued jobs had no drain token for %.0f s (e.g. ring %d); sent %d token(s)",
        len(stuck),
        wait,
        min(stuck),
        sent,
    )
    return sent


def sweep_once() -> None:
    """The retention sweep's timer callback (``sweep_if_due`` logs what it does)."""
    sweep_if_due(runtime())


def _declare_queues(current: Settings) -> None:
    """Declare the queues at start-up: RabbitMQ drops a message dead-lettered to a missing
    queue, and a node binds every queue of the app to the delayed-delivery exchange."""
    if not uses_amqp(current):
        return
    try:
        with broker_channel() as (conn, _channel):
            declare_queues(conn, current)
    except (OperationalError, OSError) as exc:
        log.warning(
            "reconciler: queues not declared at start-up (%s); the first pass declares <prefix>.dead", exc
        )


class Reconciler(bootsteps.StartStopStep):
    """Runs ``reconcile_once`` on the worker's timer every ``requeue_after_seconds / 2``."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.tref: Any = None
        self.sweep_ref: Any = None

    def start(self, parent: Any) -> None:
        """Start the timer (the interval comes from the app's settings)."""
        current = settings()
        _declare_queues(current)
        interval = current.worker.requeue_after_seconds / 2
        self.tref = parent.timer.call_repeatedly(interval, reconcile_once, priority=10)
        if retention_of(current).enabled:
            self.sweep_ref = parent.timer.call_repeatedly(SWEEP_EVERY_SECONDS, sweep_once, priority=10)

    def stop(self, parent: Any) -> None:
        """Cancel the timer."""
        for ref in (self.tref, self.sweep_ref):
            if ref is not None:
                ref.cancel()
        self.tref = self.sweep_ref = None


app.steps["worker"].add(Reconciler)
