"""Celery tasks: thin wrappers that validate ids, call the core and return small JSON.

Flow: ``ctxcore.compact`` asks the fair scheduler for a job (coalesced) and sends one
``ctxcore.drain`` token per new job; a drain token pops the next job round-robin over
tenants and sends its first stage; each ``ctxcore.stage.<kind>`` task takes the
conversation's lock, runs ``Coordinator.run_stage`` (CAS save), releases, and sends the next
stage only while the view is still over target. Payloads carry ids and stage records,
never message bodies.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from celery import Task

from ctxcore.coordinator import INVALID_SUMMARY
from ctxcore.pipeline import STAGE_ORDER, Stage
from ctxcore.state import ConversationKey
from ctxcore.summarize.errors import TRANSIENT_KINDS
from workers.app import JOBS_QUEUE, STAGES_QUEUE, app, runtime
from workers.locks import LockBusy, conversation_lock

log = logging.getLogger(__name__)

__all__ = ["CeleryQueue", "compact", "drain", "request_compaction", "stage_task"]


def request_compaction(key: ConversationKey, reason: str = "window") -> str:
    """Ask for a compaction of ``key``; sends a drain token when a new job was queued."""
    rt = runtime()
    if rt.scheduler.request(key):
        drain.apply_async(queue=JOBS_QUEUE)
        return "queued"
    return str(rt.scheduler.status(key))


class CeleryQueue:
    """The fast path's ``CompactionQueue`` backed by the scheduler and Celery."""

    def request(self, key: ConversationKey) -> str:
        """Queue a compaction (coalesced) and report the status."""
        return request_compaction(key)

    def status(self, key: ConversationKey) -> str:
        """``idle``, ``queued`` or ``running``."""
        return str(runtime().scheduler.status(key))


@app.task(name="ctxcore.compact", acks_late=True)
def compact(tenant: str, conversation: str, reason: str = "manual") -> dict[str, Any]:
    """Decide whether ``tenant/conversation`` needs work and queue it (coalesced)."""
    key = ConversationKey(tenant, conversation)
    return {"conversation": str(key), "reason": reason, "status": request_compaction(key, reason)}


@app.task(name="ctxcore.drain", acks_late=True)
def drain() -> dict[str, Any]:
    """Start the next job, fairly: tokens are interchangeable, the scheduler picks the job."""
    rt = runtime()
    job = rt.scheduler.next_job()
    if job is None:
        return {"job": None}
    planned = _plan_and_send(job.key, [])
    return {"job": str(job.key), "stage": planned}


def _finish(key: ConversationKey) -> None:
    if runtime().scheduler.finish(key):
        drain.apply_async(queue=JOBS_QUEUE)


def _plan_and_send(key: ConversationKey, exhausted: list[str]) -> str | None:
    rt = runtime()
    try:
        stage = rt.coordinator.plan(key, exhausted=exhausted)
    except Exception:
        log.exception("planning %s failed", key)
        rt.metrics.inc("ctxcore_failures_total", kind="planning")
        _finish(key)
        raise
    if stage is None:
        _finish(key)
        return None
    STAGE_TASKS[stage.kind].apply_async(
        args=[key.tenant_id, key.conversation_id, stage.model_dump(mode="json"), exhausted],
        queue=STAGES_QUEUE,
    )
    return stage.kind


def _retry_delay(task: Task, retry_after: float | None) -> float:
    delays = runtime().settings.worker.retry_delays
    base = delays[min(task.request.retries, len(delays) - 1)] if delays else 1.0
    delay = base * random.uniform(0.8, 1.2)
    return max(delay, retry_after or 0.0)


def _run_stage(
    task: Task, tenant: str, conversation: str, stage_json: dict[str, Any], exhausted: list[str]
) -> dict[str, Any]:
    rt = runtime()
    key = ConversationKey(tenant, conversation)
    stage = Stage.model_validate(stage_json)
    rt.scheduler.renew(key)
    started = time.perf_counter()
    try:
        with conversation_lock(rt.redis, rt.settings.redis.key_prefix, key, rt.settings.worker.lock_timeout):
            result = rt.coordinator.run_stage(key, stage)
    except LockBusy:
        # Another stage of this conversation is running (e.g. a redelivered duplicate).
        raise task.retry(countdown=1.0, max_retries=300) from None
    elapsed = time.perf_counter() - started
    rt.metrics.observe("ctxcore_stage_seconds", elapsed, stage=stage.kind)
    rt.metrics.inc("ctxcore_compactions_total", stage=stage.kind, outcome=result.outcome)
    if result.model_calls:
        rt.metrics.add_usage(tenant, result.model_calls, result.input_tokens, result.output_tokens)
    summary: dict[str, Any] = {
        "conversation": str(key),
        "stage": stage.kind,
        "outcome": result.outcome,
        "version": result.state.version,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
    }
    if result.outcome == "compressed":
        rt.metrics.inc("ctxcore_tokens_saved_total", max(result.tokens_before - result.tokens_after, 0))
        summary["next"] = _plan_and_send(key, exhausted)
    elif result.outcome == "conflict":
        rt.metrics.inc("ctxcore_cas_conflicts_total")
        summary["next"] = _plan_and_send(key, exhausted)
    elif result.outcome == "skipped":
        summary["next"] = _plan_and_send(key, [*exhausted, stage.kind])
    elif result.outcome == "rejected":
        # Deterministic (the same view gives the same invalid summary): no retry; the
        # stage is exhausted and planning moves on to the next kind.
        rt.metrics.inc("ctxcore_failures_total", kind=INVALID_SUMMARY)
        summary["error_kind"] = result.error_kind
        summary["next"] = _plan_and_send(key, [*exhausted, stage.kind])
    else:
        kind = result.error_kind or "unknown"
        rt.metrics.inc("ctxcore_failures_total", kind=kind if kind in _KNOWN_KINDS else "other")
        summary["error_kind"] = kind
        if kind in TRANSIENT_KINDS and task.request.retries < len(rt.settings.worker.retry_delays):
            raise task.retry(countdown=_retry_delay(task, result.retry_after))
        # Permanent, or out of retries: the state stays as it was; move on.
        summary["next"] = (
            _plan_and_send(key, [*exhausted, stage.kind]) if kind not in TRANSIENT_KINDS else None
        )
        if summary["next"] is None and kind in TRANSIENT_KINDS:
            _finish(key)
    log.info("stage done: %s", summary)
    return summary


_KNOWN_KINDS = frozenset(
    {
        "context_overflow",
        "rate_limit",
        "authentication",
        "timeout",
        "server_unstable",
        "api_request_error",
        "unknown",
        "summarizer_empty",
        "circuit_open",
        INVALID_SUMMARY,
    }
)


def _make_stage_task(kind: str) -> Task:
    def stage_task(
        self: Task, tenant: str, conversation: str, stage: dict[str, Any], exhausted: list[str]
    ) -> dict[str, Any]:
        return _run_stage(self, tenant, conversation, stage, exhausted)

    stage_task.__name__ = f"stage_{kind}"
    stage_task.__doc__ = f"Run one {kind} stage of a conversation under its lock and save it with CAS."
    return app.task(name=f"ctxcore.stage.{kind}", bind=True, acks_late=True)(stage_task)  # type: ignore[no-any-return]


STAGE_TASKS: dict[str, Task] = {kind: _make_stage_task(kind) for kind in STAGE_ORDER}
stage_task = STAGE_TASKS
