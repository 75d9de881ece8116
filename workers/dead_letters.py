"""Dead letters on RabbitMQ: each message in ``<prefix>.dead`` is logged once, at ERROR.

A message lands there after ``worker.delivery_limit`` deliveries (workers/broker.py), e.g. a
stage that kills its worker every time. The reconciler calls ``report_dead_letters`` every
pass: it reads up to ``SCAN_LIMIT`` messages from the queue's head without acknowledging
them (each is rejected back to the queue after the scan), and logs each one not seen before
with its task, task id and conversation. Seen task ids are a Redis set shared by every
worker, so N workers log a message once. The queue keeps its messages for an operator to
inspect or move (its depth is ``ctxcore_dead_letter_messages`` on ``/metrics``).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from ctxcore.config import Settings
from workers.broker import dead_letter_queue, queue_names, uses_amqp
from workers.broker_queues import broker_channel

__all__ = ["SCAN_LIMIT", "describe", "report_dead_letters"]

log = logging.getLogger(__name__)

SCAN_LIMIT = 200
# The seen set outlives any message an operator would leave in the queue for long.
SEEN_TTL_SECONDS = 7 * 24 * 3600


def describe(headers: dict[str, Any]) -> tuple[str, str, str, str]:
    """Task name, task id, conversation (``argsrepr``: ``tenant/conversation``) and the
    reason RabbitMQ gave (``x-death``) of a dead-lettered Celery message."""
    deaths = headers.get("x-death") or [{}]
    first = deaths[0] if isinstance(deaths, list) and deaths else {}
    reason = f"{first.get('reason', '?')} in {first.get('queue', '?')}"
    task = str(headers.get("task", "?"))
    if task.startswith("ctxcore.stage."):
        conversation = str(headers.get("argsrepr") or "?").strip("'\"")
    else:
        # A drain token names no conversation, only its ring.
        conversation = f"no conversation (kwargs {headers.get('kwargsrepr') or '{}'})"
    return task, str(headers.get("id", "?")), conversation, reason


def report_dead_letters(settings: Settings, client: redis.Redis) -> int:
    """Log each dead letter not reported before; returns how many were new (0 on Redis)."""
    if not uses_amqp(settings):
        return 0
    dead = queue_names(settings).dead
    seen_key = f"{settings.redis.key_prefix}:dead-letters:seen"
    new = 0
    with broker_channel() as (_conn, channel):
        dead_letter_queue(settings).bind(channel).declare()
        tags: list[int] = []
        for _ in range(SCAN_LIMIT):
            message = channel.basic_get(queue=dead, no_ack=False)
            if message is None:
                break
            tags.append(message.delivery_tag)
            task, task_id, conversation, reason = describe(dict(message.headers or {}))
            if client.sadd(seen_key, task_id) == 1:
                new += 1
                log.error(
                    "dead letter in %s: task %s[%s] of %s was delivered more than "
                    "worker.delivery_limit=%d times without completing (%s); it stays in %s for inspection",
                    dead,
                    task,
                    task_id,
                    conversation,
                    settings.worker.delivery_limit,
                    reason,
                    dead,
                )
        if new:
            client.expire(seen_key, SEEN_TTL_SECONDS)
        # Every message read goes back to the queue, in order (held until now so that the
        # scan never reads one twice; closing the channel would return them too, later).
        for tag in tags:
            channel.basic_reject(tag, requeue=True)
    return new
