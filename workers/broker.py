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
fewer ready messages than ``worker.concurrency`` (``workers.broker_queues.wait_for_stage_room``).
This module never imports ``workers.app`` (the app imports it); what needs the app's
connection pool is in ``workers.broker_queues``.
"""

from __future__ import annotations

import logging
import math
from typing import Literal, NamedTuple
from urllib.parse import urlsplit

from amqp.exceptions import AccessRefused, NotAllowed
from kombu import Connection, Exchange, Queue

from ctxcore.config import Settings
from ctxcore.errors import ConfigError

__all__ = [
    "NodeKind",
    "QueueNames",
    "amqp_queues",
    "broker_url",
    "check_broker",
    "dead_letter_queue",
    "declare_queues",
    "is_amqp",
    "node_queues",
    "public_host",
    "queue_names",
    "result_backend_url",
    "retry_countdown",
    "uses_amqp",
]

log = logging.getLogger(__name__)

NodeKind = Literal["all", "stages", "drain"]
_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
# A broker that does not answer within this long is reported, not waited for.
CHECK_TIMEOUT = 3.0


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
    except (AccessRefused, NotAllowed):  # AMQP 403 and 530: py-amqp's, the transport of amqp:// URLs
        raise ConfigError(
            f"broker {public_host(url)} refused the login of worker.broker_url "
            "(CTXCORE_BROKER_URL): check its user, password and virtual host"
        ) from None
    finally:
        conn.release()
