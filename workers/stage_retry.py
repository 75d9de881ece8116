"""A failed stage attempt: its log line, and a retry while retries are left, else the failure."""

from __future__ import annotations

import logging
import random
from typing import Any, NoReturn

from celery import Task

from ctxcore.errors import ModelError
from ctxcore.state import ConversationKey
from ctxcore.summarize.errors import TRANSIENT_KINDS
from workers.app import runtime
from workers.broker import retry_countdown
from workers.failures import model_error_message, public_endpoint
from workers.heartbeat import beat_until_due

__all__ = ["attempt_line", "retry_delay", "retry_or_raise"]

# The attempt lines keep the stage tasks' logger name, which operators filter on.
log = logging.getLogger("workers.tasks")


def retry_delay(task: Task[Any, Any], retry_after: float | None) -> float:
    """The countdown of a stage's next attempt: the configured delay of this retry, jittered,
    never below the endpoint's ``Retry-After``."""
    delays = runtime().settings.worker.retry_delays
    base = delays[min(task.request.retries, len(delays) - 1)] if delays else 1.0
    delay = base * random.uniform(0.8, 1.2)
    return retry_countdown(runtime().settings, max(delay, retry_after or 0.0))


def attempt_line(
    task: Task[Any, Any], key: ConversationKey, stage: str, kind: str, exc: BaseException
) -> str:
    """The log line of one failed attempt (its cause, never the endpoint's credentials)."""
    endpoint = public_endpoint(runtime().settings.model_for_tenant(key.tenant_id).base_url)
    text = model_error_message(exc) if isinstance(exc, ModelError) else str(exc)
    return (
        f"stage {stage} of {key} failed (attempt {task.request.retries + 1}): kind={kind} "
        f"{type(exc).__name__}: {text}; endpoint {endpoint}"
    )


def retry_or_raise(
    task: Task[Any, Any],
    key: ConversationKey,
    stage: str,
    kind: str,
    error: Exception,
    retry_after: float | None = None,
) -> NoReturn:
    """Retry a transient failure while retries are left (``RETRY``), else raise it (``FAILURE``)."""
    rt = runtime()
    if kind in TRANSIENT_KINDS | {"store_unavailable"} and task.request.retries < len(
        rt.settings.worker.retry_delays
    ):
        countdown = retry_delay(task, retry_after)
        log.warning(
            "%s; retry in %.1f s", attempt_line(task, key, stage, kind, error.__cause__ or error), countdown
        )
        # A pending task: the job shows life until the retry is due (plus the margin).
        beat_until_due(rt.scheduler, key, countdown)
        raise task.retry(countdown=countdown, exc=error, max_retries=len(rt.settings.worker.retry_delays))
    raise error
