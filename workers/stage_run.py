"""One stage of a compaction job, as its Celery task runs it: under the conversation's lock,
``Coordinator.run_stage`` (CAS save), journaled and measured, then the next stage planned.

The Coordinator handles classified model errors (``outcome="failed"``), results that would
break the chat protocol (``outcome="rejected"``, kind ``invalid_summary``) and lost CAS races;
here a transient kind or a store outage is retried (``worker.retry_delays``: Celery
``RETRY``), and a permanent kind (``invalid_summary`` included: it is deterministic), or a
transient one out of retries, ends the task as ``FAILURE`` with ``StageFailedError(kind,
message)`` as its exception. A stage its tenant's summariser cap refused leaves a hold
(``workers.holds``) and lets only the model-free stages run on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from celery import Task

from ctxcore.coordinator import INVALID_SUMMARY
from ctxcore.errors import StoreUnavailable
from ctxcore.pipeline import Stage
from ctxcore.state import ConversationKey
from ctxcore.status import Hold
from ctxcore.summarize.errors import ERROR_KINDS
from workers.app import runtime
from workers.failures import StageFailedError, model_error_message
from workers.heartbeat import heartbeat, heartbeat_interval
from workers.holds import budget_hold
from workers.jobs import MODEL_STAGES, plan_and_send
from workers.journal import error_entry, result_entry, write_entry
from workers.locks import LockBusy, conversation_lock
from workers.prom_worker import stage_metrics
from workers.scrubbing import scrub_exception
from workers.spend import SummariserBudgetExhausted
from workers.stage_retry import retry_or_raise
from workers.telemetry.spans import traced_stage

__all__ = ["run_stage"]

log = logging.getLogger("workers.tasks")  # the name operators filter the stages' lines on

# Labels of ctxcore_failures_total (a closed set: anything else counts as "other").
_KNOWN_KINDS = frozenset(
    {*ERROR_KINDS, "summarizer_empty", "circuit_open", "internal", "store_unavailable", INVALID_SUMMARY}
)


def run_stage(
    task: Task[Any, Any], tenant: str, conversation: str, stage_json: dict[str, Any], exhausted: list[str]
) -> dict[str, Any]:
    """Run one stage of ``tenant/conversation`` (see the module docstring); the summary
    Flower shows as the task's result."""
    rt = runtime()
    key = ConversationKey(tenant, conversation)
    stage = Stage.model_validate(stage_json)
    started = time.perf_counter()
    try:
        rt.scheduler.renew(key)
        with (
            heartbeat(rt.scheduler, key, heartbeat_interval(rt.settings.worker)),
            conversation_lock(rt.redis, rt.settings.redis.key_prefix, key, rt.settings.worker.lock_timeout),
        ):
            result = traced_stage(rt.tracer, key, stage, rt.coordinator.run_stage)
    except LockBusy:
        # Another stage of this conversation is running (e.g. a redelivered duplicate).
        raise task.retry(countdown=1.0, max_retries=300) from None
    except StoreUnavailable as exc:
        stage_metrics().failures.labels("store_unavailable").inc()
        scrubbed = scrub_exception(exc, rt.secrets)
        write_entry(
            rt.journal,
            key,
            error_entry(stage.kind, "failed", started, kind="store_unavailable", message=str(scrubbed)),
        )
        retry_or_raise(task, key, stage.kind, "store_unavailable", scrubbed)
    except SummariserBudgetExhausted as exc:
        return _budget_exhausted(key, stage, exhausted, exc, started)
    elapsed = time.perf_counter() - started
    if result.outcome not in ("failed", "rejected"):  # those are journaled with their error below
        write_entry(rt.journal, key, result_entry(stage.kind, result, started))
    metrics = stage_metrics()
    metrics.stage_seconds.labels(stage.kind, result.outcome).observe(elapsed)
    if result.model_calls:
        rt.usage.add(tenant, result.model_calls, result.input_tokens, result.output_tokens)
    summary: dict[str, Any] = {
        "conversation": str(key),
        "stage": stage.kind,
        "outcome": result.outcome,
        "version": result.state.version,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
    }
    hold: Hold | None
    if result.outcome == "compressed":
        rt.failures.version_saved(key)
        metrics.tokens_saved.inc(max(result.tokens_before - result.tokens_after, 0))
        summary["next"], hold = plan_and_send(key, exhausted)
    elif result.outcome == "conflict":
        # Another worker saved first (a redelivered duplicate, or this worker lost its lock
        # while cut off): the work is discarded, visibly, and the next stage re-planned.
        log.warning(
            "stage %s of %s lost its compare-and-swap: planned on version %d, the state is at version %d (%s)",
            stage.kind,
            key,
            stage.based_on_version,
            result.state.version,
            result.detail or "another writer saved first",
        )
        metrics.cas_conflicts.inc()
        summary["next"], hold = plan_and_send(key, exhausted)
    elif result.outcome == "skipped":
        summary["detail"] = result.detail
        summary["next"], hold = plan_and_send(key, [*exhausted, stage.kind], result.detail)
    else:
        # A classified failure, the state untouched: a model error (retried while transient,
        # else FAILURE) or a rejected result (``invalid_summary``: deterministic, the same
        # view gives the same invalid summary, so FAILURE at once). on_failure then records
        # it and escalates: for a rejected result only this stage is exhausted.
        kind = result.error_kind or "unknown"
        metrics.failures.labels(kind if kind in _KNOWN_KINDS else "other").inc()
        cause = result.exception
        error = StageFailedError(kind, model_error_message(cause) if cause else result.error or kind)
        error.__cause__ = cause
        # Before the retry's log line and the journal: a provider may echo the key it was sent.
        scrub_exception(error, rt.secrets)
        write_entry(rt.journal, key, result_entry(stage.kind, result, started, error.message))
        retry_or_raise(task, key, stage.kind, kind, error, result.retry_after)
    if hold is not None:
        summary["hold"] = hold.reason  # Flower shows why the job stopped
    log.info("stage done: %s", summary)
    return summary


def _budget_exhausted(
    key: ConversationKey,
    stage: Stage,
    exhausted: Sequence[str],
    exc: SummariserBudgetExhausted,
    started: float,
) -> dict[str, Any]:
    """A stage refused by its tenant's summariser cap (no model call was made): pause the
    conversation (``budget_exhausted``) and let only the model-free stages run on."""
    rt = runtime()
    write_entry(rt.journal, key, error_entry(stage.kind, "paused", started, detail=str(exc)))
    hold = budget_hold(rt.coordinator.sizes(key), exc)
    rt.failures.put_hold(key, hold)
    stage_metrics().holds.labels(hold.reason).inc()
    log.warning("stage %s of %s not run, compaction paused (budget_exhausted): %s", stage.kind, key, exc)
    model_free = [*exhausted, *(k for k in MODEL_STAGES if k not in exhausted)]
    summary: dict[str, Any] = {
        "conversation": str(key),
        "stage": stage.kind,
        "outcome": "paused",
        "next": plan_and_send(key, model_free)[0],
        "hold": hold.reason,
    }
    log.info("stage done: %s", summary)
    return summary
