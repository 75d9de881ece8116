"""A running job's signs of life in the scheduler (``FairScheduler.beat``).

While a stage runs, a thread of its task pushes the job's beat deadline on every
``worker.heartbeat_seconds`` (to twice that from now); a stage sent, or waiting for its retry
countdown, pushes it to when it is due plus that margin. A job whose deadline passes has lost
its stage: the reconciler queues it again (``workers.lost_jobs``). A beat that cannot be
written (Redis down) is logged and skipped: nothing can be recorded then, and the reconciler
that runs once Redis answers again finds the job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ctxcore.config import WorkerSettings
from ctxcore.errors import StoreUnavailable
from ctxcore.state import ConversationKey
from workers.scheduler import FairScheduler

__all__ = ["beat_until_due", "heartbeat", "heartbeat_interval"]

log = logging.getLogger(__name__)


def heartbeat_interval(worker: WorkerSettings) -> float:
    """Seconds between a running stage's heartbeats: ``worker.heartbeat_seconds``, unset:
    10 s, or half of ``worker.hard_time_limit`` when that is shorter."""
    if worker.heartbeat_seconds is not None:
        return worker.heartbeat_seconds
    return min(10.0, worker.hard_time_limit / 2)


def beat_until_due(scheduler: FairScheduler, key: ConversationKey, due_in: float = 0.0) -> None:
    """A stage of ``key`` was sent (``due_in`` 0) or waits ``due_in`` seconds for its retry:
    the job shows life until then plus ``liveness_seconds``."""
    try:
        scheduler.beat(key, due_in + scheduler.liveness_seconds)
    except StoreUnavailable as exc:
        log.warning("heartbeat of %s not written (%s): the reconciler decides once Redis answers", key, exc)


@contextmanager
def heartbeat(scheduler: FairScheduler, key: ConversationKey, every: float) -> Iterator[None]:
    """Beat for ``key`` now and every ``every`` seconds while the block runs (a daemon
    thread, stopped and joined when the block ends, so no beat lands after it)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            beat_until_due(scheduler, key)

    beat_until_due(scheduler, key)
    thread = threading.Thread(target=run, name=f"heartbeat {key}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
