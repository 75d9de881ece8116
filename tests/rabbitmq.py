"""RabbitMQ for the ``rabbitmq`` tests: the server check and a deployment's clean-up.

Each test gets its own key prefix, hence its own queues and exchanges
(``<prefix>.jobs``/``.stages``/``.dead``, ``<prefix>.events``, the control mailbox); the
clean-up deletes exactly those. RabbitMQ is shared with other runs: nothing is purged, and
Celery's delayed-delivery topology (``celery_delayed_*``, declared once per virtual host and
shared by every Celery app on it) is left in place; the bindings to this test's exchanges go
with them.
"""

from __future__ import annotations

import contextlib
import os

from kombu import Connection

RABBITMQ_URL = os.environ.get("CTXCORE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def rabbitmq_problem(url: str = RABBITMQ_URL) -> str | None:
    """None when ``url`` accepts a connection, else why not."""
    conn = Connection(url, connect_timeout=2)
    try:
        conn.connect()
    except (*conn.connection_errors, *conn.channel_errors) as exc:
        return f"no RabbitMQ at {url.split('@')[-1]}: {exc}"
    finally:
        conn.release()
    return None


def declared_names(prefix: str) -> tuple[list[str], list[str]]:
    """The queues and exchanges a deployment with key prefix ``prefix`` declares."""
    queues = [f"{prefix}.jobs", f"{prefix}.stages", f"{prefix}.dead"]
    exchanges = [
        f"{prefix}.jobs",
        f"{prefix}.stages",
        f"{prefix}.events",
        f"{prefix}.control.pidbox",
        f"reply.{prefix}.control.pidbox",
    ]
    return queues, exchanges


def delete_deployment(prefix: str, url: str = RABBITMQ_URL) -> None:
    """Delete the queues and exchanges of ``prefix`` (those absent are skipped)."""
    queues, exchanges = declared_names(prefix)
    with Connection(url, connect_timeout=5) as conn:
        for kind, names in (("queue", queues), ("exchange", exchanges)):
            for name in names:
                # One channel per delete: deleting a missing name closes its channel (404).
                channel = conn.channel()
                with contextlib.suppress(*conn.channel_errors):
                    if kind == "queue":
                        channel.queue_delete(name)
                    else:
                        channel.exchange_delete(name)
                with contextlib.suppress(*conn.channel_errors, *conn.connection_errors):
                    channel.close()


def ready_messages(url: str, queues: list[str]) -> int:
    """Ready messages in ``queues`` (a missing queue counts 0); passive declares only."""
    total = 0
    with Connection(url, connect_timeout=5) as conn:
        for name in queues:
            channel = conn.channel()
            try:
                total += int(channel.queue_declare(queue=name, passive=True).message_count)
            except conn.channel_errors as exc:
                if getattr(exc, "code", None) != 404:
                    raise
            finally:
                with contextlib.suppress(*conn.channel_errors, *conn.connection_errors):
                    channel.close()
    return total
