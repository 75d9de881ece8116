"""Celery's broker: its URL, its queues and what differs on RabbitMQ (docs/reliability.md).

``worker.broker_url`` and ``worker.result_backend_url`` default to ``redis.url``. On an AMQP
broker (RabbitMQ) ``<prefix>.jobs`` and ``<prefix>.stages`` are quorum queues on topic
exchanges of the same names (Celery's native delayed delivery, which carries a retry's
countdown, cannot route through direct exchanges). Each has ``x-delivery-limit`` =
``worker.delivery_limit``: a message returned more often (its consumer died each time) is
dead-lettered through the default exchange to ``<prefix>.dead``, which this module declares
before any worker consumes, since RabbitMQ drops a message dead-lettered to a missing queue.

RabbitMQ has no priority across queues, so ``ctxcore worker`` runs a stages node and a drain
node there (``node_queues``), and a drain starts a new job only while the stages queue holds
fewer ready messages than ``worker.concurrency`` (``wait_for_stage_room``). This module
imports ``workers.app`` only inside functions (the app imports it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast
from urllib.parse import urlsplit

from kombu import Connection, Exchange, Queue
from kombu.exceptions import OperationalError

if TYPE_CHECKING:
    from kombu.connection import ConnectionPool

from ctxcore.config import Settings
from ctxcore.errors import ConfigError

__all__ = [
    "NodeKind",
    "QueueNames",
    "amqp_queues",
    "broker_channel",
    "broker_url",
    "check_broker",
    "dead_letter_depth",
    "dead_letter_queue",
    "declare_queues",
    "is_amqp",
    "node_queues",
    "public_host",
    "queue_names",
    "queue_ready",
    "result_backend_url",
    "retry_countdown",
    "uses_amqp",
    "wait_for_stage_room",
]

log = logging.getLogger(__name__)

NodeKind = Literal["all", "stages", "drain"]
_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
# A broker that does not answer within this long is reported, not waited for.
CHECK_TIMEOUT = 3.0
STAGE_ROOM_POLL = 0.5


class QueueNames(NamedTuple):
    """A deployment's Celery queues: new jobs (drain tokens) and continuation stages."""

    jobs: str
    stages: str

    def consume_order(self) -> list[str]:
        """Stages first, then jobs: running compactions finish before new ones start."""
        return [self.stages, self.jobs]

    @property
    def dead(self) -> str:
        """The dead-letter queue of an AMQP broker (``<prefix>.dead``)."""
        return self.jobs.removesuffix(".jobs") + ".dead"


def queue_names(settings: Settings) -> QueueNames:
    """``<prefix>.jobs`` and ``<prefix>.stages`` for ``settings.redis.key_prefix``."""
    prefix = settings.redis.key_prefix
    return QueueNames(f"{prefix}.jobs", f"{prefix}.stages")


def broker_url(settings: Settings) -> str:
    """``worker.broker_url``, else ``redis.url``."""
    return settings.worker.broker_url or settings.redis.url


def result_backend_url(settings: Settings) -> str:
    """``worker.result_backend_url``, else ``redis.url``."""
    return settings.worker.result_backend_url or settings.redis.url


def is_amqp(url: str) -> bool:
    """True for an AMQP (RabbitMQ) URL."""
    return url.split("://", 1)[0].lower() in _AMQP_SCHEMES


def uses_amqp(settings: Settings) -> bool:
    """True when Celery's broker is RabbitMQ."""
    return is_amqp(broker_url(settings))


def public_host(url: str) -> str:
    """``scheme://host:port`` of ``url``: what an error may show (never user or password)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '127.0.0.1'}{port}"


def amqp_queues(settings: Settings) -> tuple[Queue, Queue]:
    """The jobs and stages quorum queues of an AMQP broker."""
    names = queue_names(settings)
    arguments = {
        "x-queue-type": "quorum",
        "x-delivery-limit": settings.worker.delivery_limit,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": names.dead,
    }
    jobs, stages = (
        Queue(name, Exchange(name, type="topic"), routing_key=name, queue_arguments=arguments)
        for name in (names.jobs, names.stages)
    )
    return jobs, stages


def dead_letter_queue(settings: Settings) -> Queue:
    """``<prefix>.dead``: a quorum queue without a delivery limit (reading it never drops)."""
    name = queue_names(settings).dead
    return Queue(name, exchange=Exchange(""), routing_key=name, queue_arguments={"x-queue-type": "quorum"})


def node_queues(settings: Settings, node: NodeKind) -> list[str]:
    """The ``-Q`` queues of one worker node: both (stages first), or one of them."""
    names = queue_names(settings)
    if node == "stages":
        return [names.stages]
    if node == "drain":
        return [names.jobs]
    return names.consume_order()


def retry_countdown(settings: Settings, delay: float) -> float:
    """A retry's countdown as the broker can carry it: RabbitMQ's delayed delivery counts
    whole seconds (a countdown below 1 s would fail to route), so it is rounded up there."""
    if uses_amqp(settings):
        return float(max(math.ceil(delay), 1))
    return delay


def declare_queues(conn: Connection, settings: Settings) -> None:
    """Declare ``<prefix>.dead``, then the jobs and stages queues with their exchanges, on
    ``conn`` (idempotent). Before any node starts: each node binds every queue of the app
    to Celery's delayed-delivery exchange, which fails for a queue not declared yet."""
    channel = conn.default_channel
    for queue in (dead_letter_queue(settings), *amqp_queues(settings)):
        queue.bind(channel).declare()


def check_broker(settings: Settings) -> None:
    """Start-up check of an AMQP broker: a refused login raises ``ConfigError`` naming the
    host (never the password); a broker not answering yet is only logged (Celery keeps
    reconnecting). Declares the queues (``declare_queues``). A Redis broker is checked by
    ``Runtime.scheduler.check`` (``workers.runtime.check_startup``)."""
    url = broker_url(settings)
    if not is_amqp(url):
        return
    conn = Connection(url, connect_timeout=CHECK_TIMEOUT)
    try:
        conn.connect()
        declare_queues(conn, settings)
    except conn.connection_errors as exc:
        log.warning("broker %s not reachable at start-up (%s); Celery keeps retrying", public_host(url), exc)
    except conn.channel_errors as exc:
        if getattr(exc, "code", None) in (403, 530):
            raise ConfigError(
                f"broker {public_host(url)} refused the login of worker.broker_url "
                "(CTXCORE_BROKER_URL): check its user, password and virtual host"
            ) from None
        raise
    finally:
        conn.release()


@contextlib.contextmanager
def broker_channel() -> Iterator[tuple[Any, Any]]:
    """A fresh channel on the app's pooled broker connection (a channel error closes only it)."""
    from workers.app import app

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
    with broker_channel() as (conn, channel):
        try:
            return int(channel.queue_declare(queue=name, passive=amqp).message_count)
        except conn.channel_errors as exc:
            if getattr(exc, "code", None) == 404:
                return 0
            raise


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
