"""Channels and queue depths on the Celery app's pooled broker connection.

Split from ``workers.broker`` (which ``workers.app`` imports to build its configuration) so
that module never imports the app: this one does, at the top.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from amqp.exceptions import NotFound
from kombu.exceptions import OperationalError

from ctxcore.config import Settings
from workers.app import app
from workers.broker import queue_names, uses_amqp

if TYPE_CHECKING:
    from kombu.connection import ConnectionPool

__all__ = ["broker_channel", "dead_letter_depth", "queue_ready", "wait_for_stage_room"]

log = logging.getLogger(__name__)

STAGE_ROOM_POLL = 0.5


@contextlib.contextmanager
def broker_channel() -> Iterator[tuple[Any, Any]]:
    """A fresh channel on the app's pooled broker connection (a channel error closes only it)."""
    # celery-types declares ``app.pool`` a ``ProducerPool``; Celery returns kombu's
    # ``ConnectionPool`` (``pools.connections[...]``), whose ``acquire`` gives a ``Connection``.
    pool = cast("ConnectionPool", app.pool)
    with pool.acquire(block=True) as conn:
        channel = conn.channel()
        try:
            yield conn, channel
        finally:
            with contextlib.suppress(*conn.connection_errors, *conn.channel_errors):
                channel.close()


def queue_ready(name: str, amqp: bool) -> int:
    """Ready messages in queue ``name`` (0 when it does not exist yet).

    On RabbitMQ the declare is passive: an active one without the quorum arguments would be
    refused as inequivalent. kombu's Redis channel counts every priority level.
    """
    with broker_channel() as (_, channel):
        try:
            return int(channel.queue_declare(queue=name, passive=amqp).message_count)
        except NotFound:  # AMQP 404 to a passive declare: py-amqp's, the transport of amqp:// URLs
            return 0


def dead_letter_depth(settings: Settings) -> int | None:
    """Messages in ``<prefix>.dead`` (None on a Redis broker, which has no dead letters)."""
    if not uses_amqp(settings):
        return None
    return queue_ready(queue_names(settings).dead, amqp=True)


def wait_for_stage_room(settings: Settings) -> float:
    """On RabbitMQ, block (holding the caller's drain token) while the stages queue holds
    ``worker.concurrency`` or more ready messages; returns the seconds waited.

    The wait is capped at half of ``worker.soft_time_limit`` so the drain task never runs
    into its own time limit: a backlog that outlasts it is saturation, and the job starts.
    """
    if not uses_amqp(settings):
        return 0.0
    worker = settings.worker
    stages = queue_names(settings).stages
    started = time.monotonic()
    deadline = started + worker.soft_time_limit / 2
    while _stages_ready(stages) >= worker.concurrency:
        if time.monotonic() >= deadline:
            log.info("stages queue still full after %.0f s; starting the job anyway", deadline - started)
            break
        time.sleep(STAGE_ROOM_POLL)
    return time.monotonic() - started


def _stages_ready(stages: str) -> int:
    """Ready stage messages; 0 when the broker does not answer: the drain then goes on as
    on Redis (a broker outage is met, and handled, where its first stage is sent)."""
    try:
        return queue_ready(stages, amqp=True)
    except (OperationalError, OSError) as exc:
        log.warning("stages queue depth not read (%s); starting the job", exc)
        return 0
