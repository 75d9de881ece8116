"""The reconciler's second duty: running jobs that lost their stage are queued again.

A running job's stage can vanish without a trace: a retry that could not be published while
Redis (broker and store) was down is dropped, and its failure cannot be recorded either.
Each running job has a beat deadline (``workers.heartbeat``): a running stage pushes it on
every ``worker.heartbeat_seconds``, a stage sent or waiting for its retry countdown until it
is due, each plus twice that interval. A job whose deadline passed, while no stage waits in
the stages queue (a backlog can hold a sent stage longer; the pass decides once it drains),
is queued again (``FairScheduler.requeue_lost``, atomic per job), counted in
``ctxcore_jobs_requeued_total``, logged, and shown ``failing`` with ``lost_task`` until the job
runs again. Nothing is paid twice: the job starts again from the saved state, and a stage
of the old run that turns up after all runs under the conversation's lock and finds a newer
version (a CAS conflict, before any summariser call).
"""

from __future__ import annotations

import logging

from kombu.exceptions import OperationalError

from ctxcore.errors import StoreUnavailable
from workers.broker import queue_names, uses_amqp
from workers.broker_queues import queue_ready
from workers.failures import LOST_TASK
from workers.jobs import send_drain_tokens
from workers.prom_worker import stage_metrics
from workers.runtime import Runtime

__all__ = ["requeue_lost_jobs"]

log = logging.getLogger(__name__)


def requeue_lost_jobs(rt: Runtime) -> int:
    """Queue again the running jobs without heartbeat and without pending stage for
    ``2 x worker.heartbeat_seconds``; returns how many (0 while stages wait in the queue)."""
    current = rt.settings
    try:
        if queue_ready(queue_names(current).stages, amqp=uses_amqp(current)) > 0:
            return 0
        lost = rt.scheduler.requeue_lost()
    except (StoreUnavailable, OperationalError, OSError) as exc:
        log.warning("reconciler: lost jobs not looked for: Redis or the broker unavailable (%s)", exc)
        return 0
    message = (
        f"the running job had no heartbeat and no pending stage for {rt.scheduler.liveness_seconds:g} s: "
        "its stage was lost (e.g. a retry that could not be published while Redis or the broker was "
        "down); queued again"
    )
    for job in lost:
        stage_metrics().jobs_requeued.inc()
        log.warning("reconciler: %s: %s: %s", job.key, LOST_TASK, message)
        try:
            rt.failures.record_lost(job.key, message)
        except StoreUnavailable as exc:
            log.warning("reconciler: lost_task of %s not recorded (%s)", job.key, exc)
        if job.resend:
            send_drain_tokens(1, job.ring)
    return len(lost)
