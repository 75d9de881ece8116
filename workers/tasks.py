"""Celery tasks: thin wrappers that validate ids, call the core and return small JSON.

Flow: ``ctxcore.compact`` asks the fair scheduler for a job (coalesced) and sends one
``ctxcore.drain`` token per new job; a drain token pops the next job round-robin over
tenants and sends its first stage; each ``ctxcore.stage.<kind>`` task takes the
conversation's lock, runs ``Coordinator.run_stage`` (CAS save), releases, and sends the next
stage only while the view is still over target. Payloads carry ids and stage records,
never message bodies.

Failures are visible (DESIGN, "Visible failure"). The Coordinator handles classified model
errors (``outcome="failed"``), results that would break the chat protocol
(``outcome="rejected"``, kind ``invalid_summary``) and lost CAS races; here a transient kind
or a store outage is retried (``worker.retry_delays``: Celery ``RETRY``), and a permanent
kind (``invalid_summary`` included: it is deterministic), or a transient one out of
retries, ends the task as ``FAILURE`` with ``StageFailedError(kind, message)`` as its
exception. Any other exception propagates (``FAILURE``, traceback logged, state untouched).
``StageTask.on_failure`` records the conversation's ``last_error``; after a classified
failure it sends the next stage with the failed kind exhausted (every model stage after a
transient or ``authentication`` kind: they would call the same endpoint), so planning ends
at worst with the model-free hard truncate; after any other exception the job ends at once.
A job that ended with a failed stage backs off (``workers.failures``); one that ends over
target having saved nothing, or whose stage its tenant's summariser cap refused, leaves a
hold (``workers.holds``) that no window passes until it re-arms; the result names it (Flower).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from celery import Task
from kombu.exceptions import OperationalError

from ctxcore.coordinator import INVALID_SUMMARY
from ctxcore.errors import StoreUnavailable
from ctxcore.pipeline import STAGE_ORDER, Stage
from ctxcore.state import ConversationKey
from ctxcore.status import CompactionStatus, Hold
from ctxcore.summarize.errors import ERROR_KINDS, TRANSIENT_KINDS
from ctxcore.summarize.redact import scrub
from workers.app import app, queue_names, runtime
from workers.broker_queues import wait_for_stage_room
from workers.failures import (
    FailureRecord,
    StageFailedError,
    classify_failure,
    model_error_message,
    public_endpoint,
)
from workers.heartbeat import beat_until_due, heartbeat, heartbeat_interval
from workers.holds import budget_hold, hold_at_job_end
from workers.journal import error_entry, result_entry, write_entry
from workers.locks import LockBusy, conversation_lock
from workers.prom_worker import stage_metrics
from workers.scrubbing import scrub_exception
from workers.spend import SummariserBudgetExhausted, summariser_cap
from workers.stage_retry import retry_or_raise
from workers.telemetry.spans import traced_stage

log = logging.getLogger(__name__)

__all__ = [
    "STAGE_TASKS",
    "CeleryQueue",
    "StageTask",
    "compact",
    "drain",
    "request_compaction",
    "send_drain_tokens",
    "send_stage",
]

MODEL_STAGES: tuple[str, ...] = tuple(k for k in STAGE_ORDER if k != "hard_truncate")
# Kinds that say the endpoint itself is unusable for now: every model stage would fail alike.
_ENDPOINT_KINDS = TRANSIENT_KINDS | {"authentication"}
# Labels of ctxcore_failures_total (a closed set: anything else counts as "other").
_KNOWN_KINDS = frozenset(
    {*ERROR_KINDS, "summarizer_empty", "circuit_open", "internal", "store_unavailable", INVALID_SUMMARY}
)


def send_drain_tokens(count: int = 1, ring: int | None = None) -> int:
    """Send ``count`` drain tokens of ``ring``; returns how many went out.

    A broker that refuses is logged, not raised: the job stays queued in the scheduler and
    the reconciler sends its token again after ``worker.requeue_after_seconds``.
    """
    jobs = queue_names(runtime().settings).jobs
    for sent in range(max(count, 0)):
        try:
            drain.apply_async(kwargs={} if ring is None else {"ring": ring}, queue=jobs)
        except OperationalError as exc:
            log.warning("drain token not sent (%s); the reconciler sends it again", exc)
            return sent
    return max(count, 0)


def request_compaction(key: ConversationKey, reason: str = "window") -> CompactionStatus:
    """Ask for a compaction of ``key`` (coalesced); sends a drain token when one is due.

    A conversation whose last job failed is not queued again until its backoff passes.
    """
    rt = runtime()
    if summariser_cap(rt.settings, key.tenant_id) == 0:
        return "idle"  # the tenant runs on the rules alone: no summariser call, no job
    record = rt.failures.get(key)
    if record.backing_off():
        return "failing"
    requested = rt.scheduler.request(key)
    if requested.token is not None:
        send_drain_tokens(1, requested.token)
    if record.failing:
        return "failing"
    # The status mirrored in the conversation's compaction hash: its slot, not the ring's.
    return "queued" if requested.created else rt.failures.get(key).scheduler_status


class CeleryQueue:
    """The fast path's ``CompactionQueue`` backed by the scheduler and Celery."""

    def request(self, key: ConversationKey) -> CompactionStatus:
        """Queue a compaction (coalesced, held back while failing) and report the status."""
        return request_compaction(key)

    def status(self, key: ConversationKey) -> CompactionStatus:
        """``failing`` while the last job failed, else ``idle``, ``queued`` or ``running``."""
        return self.status_from(runtime().failures.get(key))

    def status_from(self, record: FailureRecord) -> CompactionStatus:
        """``status`` from the record a window read already (the scheduler's mirror is in it)."""
        return "failing" if record.failing else record.scheduler_status


class ScrubbingTask(Task[Any, Any]):
    """Base of ctxcore's tasks: an exception leaving a task is scrubbed of the deployment's
    secrets and URLs, down its chain of causes (``workers.secrets``), before Celery stores it
    in the result backend, sends it in the ``task-failed`` event Flower shows, or logs it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except BaseException as exc:
            scrub_exception(exc, runtime().secrets)
            raise


@app.task(name="ctxcore.compact", acks_late=True, base=ScrubbingTask)
def compact(tenant: str, conversation: str, reason: str = "manual") -> dict[str, Any]:
    """Decide whether ``tenant/conversation`` needs work and queue it (coalesced)."""
    key = ConversationKey(tenant, conversation)
    return {"conversation": str(key), "reason": reason, "status": request_compaction(key, reason)}


@app.task(name="ctxcore.drain", acks_late=True, ignore_result=True, base=ScrubbingTask)
def drain(ring: int | None = None) -> dict[str, Any]:
    """Start the next job of ``ring`` (else of the rings onward), fairly: the scheduler picks
    the job; a ring with more jobs gets its token back, behind the other rings' tokens."""
    rt = runtime()
    # RabbitMQ: no cross-queue priority, so a drain holds its token while stages back up.
    wait_for_stage_room(rt.settings)
    job = rt.scheduler.next_job(ring)
    if job is None:
        return {"job": None}
    if job.resend:
        send_drain_tokens(1, job.ring)
    rt.failures.job_started(job.key)
    with rt.job_traces.job_span(job.key, job.ring, rt.tracer):  # its stages continue this trace
        try:
            planned, hold = _plan_and_send(job.key, [])
        except Exception as exc:
            # Planning failed before any stage ran: record it and end the job, then fail loudly.
            _after_failure(job.key, None, [], exc)
            raise
    held = {"hold": hold.reason} if hold is not None else {}
    return {"job": str(job.key), "stage": planned, **held}


def send_stage(key: ConversationKey, stage: Stage, exhausted: Sequence[str]) -> Any:
    """Send one stage task (returns its ``AsyncResult``); Flower lists it as ``tenant/conversation``.
    The job shows life until the stage is due (now) plus the liveness margin."""
    sent = STAGE_TASKS[stage.kind].apply_async(
        args=(key.tenant_id, key.conversation_id, stage.model_dump(mode="json"), list(exhausted)),
        queue=queue_names(runtime().settings).stages,
        # argsrepr is a message option Celery passes through **options; celery-types omits it.
        argsrepr=str(key),  # type: ignore[call-arg]
    )
    beat_until_due(runtime().scheduler, key)
    return sent


def _finish(
    key: ConversationKey, ran: Sequence[str] = (), detail: str = "", *, planned: bool = True
) -> Hold | None:
    """End the running job of ``key``: close its failure record (with the hold it leaves,
    ``workers.holds``: ``ran`` its stages that saved nothing, ``detail`` how the last ended),
    queue a follow-up if due. Returns the hold."""
    rt = runtime()
    record = rt.failures.get(key)
    failed = record.run_failed
    sizes = functools.partial(rt.coordinator.sizes, key)
    hold = hold_at_job_end(record, sizes, ran=ran, detail=detail, planned=planned)
    finished = rt.scheduler.finish(key, follow_up=not failed and hold is None)
    if finished < 0:
        return None  # not a running job: a redelivered duplicate, or a stage sent by hand
    pause = rt.failures.job_finished(key, failed, hold)
    if pause is not None:
        log.warning("compaction job of %s ended with a failed stage; not queued again for %.0f s", key, pause)
    if hold is not None and not record.run_held:
        stage_metrics().holds.labels(hold.reason).inc()
        log.warning("compaction job of %s saved nothing, held (%s): %s", key, hold.reason, hold.why)
    if finished == 1:
        send_drain_tokens(1, rt.scheduler.ring_of(key.tenant_id))
    return hold


def _plan_and_send(
    key: ConversationKey, exhausted: Sequence[str], detail: str = ""
) -> tuple[str | None, Hold | None]:
    """Send the next stage (its kind), or end the job (with the hold it left, if any)."""
    stage = runtime().coordinator.plan(key, exhausted=exhausted)
    if stage is None:
        return None, _finish(key, exhausted, detail)
    send_stage(key, stage, exhausted)
    return stage.kind, None


def _run_stage(
    task: Task[Any, Any], tenant: str, conversation: str, stage_json: dict[str, Any], exhausted: list[str]
) -> dict[str, Any]:
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
        entry = error_entry(stage.kind, "failed", started, kind="store_unavailable", message=str(scrubbed))
        write_entry(rt.journal, key, entry)
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
    summary: dict[str, Any] = {"conversation": str(key), "stage": stage.kind, "outcome": result.outcome}
    summary.update(
        version=result.state.version, tokens_before=result.tokens_before, tokens_after=result.tokens_after
    )
    hold: Hold | None
    if result.outcome == "compressed":
        rt.failures.version_saved(key)
        metrics.tokens_saved.inc(max(result.tokens_before - result.tokens_after, 0))
        summary["next"], hold = _plan_and_send(key, exhausted)
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
        summary["next"], hold = _plan_and_send(key, exhausted)
    elif result.outcome == "skipped":
        summary["detail"] = result.detail
        summary["next"], hold = _plan_and_send(key, [*exhausted, stage.kind], result.detail)
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
    summary: dict[str, Any] = {"conversation": str(key), "stage": stage.kind, "outcome": "paused"}
    summary["next"], summary["hold"] = _plan_and_send(key, model_free)[0], hold.reason
    log.info("stage done: %s", summary)
    return summary


def _after_failure(key: ConversationKey, stage: str | None, exhausted: list[str], exc: BaseException) -> None:
    """A stage (or the planning of a job) failed for good: record it, then escalate or end the job."""
    rt = runtime()
    kind, message = classify_failure(exc)
    # What tenants read: the kind and the message without the deployment's secrets or URLs.
    message = scrub(message, rt.secrets, urls=True)
    cause = exc.__cause__ if isinstance(exc, StageFailedError) and exc.__cause__ is not None else exc
    endpoint = public_endpoint(rt.settings.model_for_tenant(key.tenant_id).base_url)
    described = message if kind == "internal" else f"{type(cause).__name__}: {message}"
    log.error(
        "stage %s of %s failed for good: kind=%s %s; endpoint %s",
        stage or "planning",
        key,
        kind,
        described,
        endpoint,
    )
    if kind == "internal":
        stage_metrics().failures.labels("internal").inc()
    if not isinstance(exc, StageFailedError) and kind != "store_unavailable":
        # Classified failures and outages were journaled by the attempt that met them.
        entry = error_entry(stage or "planning", "error", None, kind=kind, message=message)
        write_entry(rt.journal, key, entry)
    try:
        rt.failures.record(key, kind, message, stage)
        if not isinstance(exc, StageFailedError) or stage is None:
            _finish(key, planned=False)
            return
        failed = MODEL_STAGES if kind in _ENDPOINT_KINDS else (stage,)
        try:
            _plan_and_send(key, [*exhausted, *(k for k in failed if k not in exhausted)])
        except Exception:
            # Planning after the failed stage broke too: end the job rather than strand it.
            _finish(key, planned=False)
            raise
    except StoreUnavailable as err:
        log.error(
            "could not record the failure of %s or end its job (%s); the reconciler re-queues it "
            "(lost_task) %.0f s after its last heartbeat, once Redis answers",
            key,
            err,
            rt.scheduler.liveness_seconds,
        )


class StageTask(ScrubbingTask):
    """Base of the stage tasks: a final failure is recorded and escalates or ends the job."""

    # A classified model failure is expected: Celery logs it without a traceback (our own
    # ERROR line names the cause); anything else is logged with its traceback.
    throws = (StageFailedError,)

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Record ``last_error`` and send the next stage (model error) or end the job."""
        tenant, conversation, stage, exhausted = args
        _after_failure(ConversationKey(tenant, conversation), stage.get("kind"), list(exhausted), exc)


def _make_stage_task(kind: str) -> Task[Any, Any]:
    def stage_task(
        self: Task[Any, Any], tenant: str, conversation: str, stage: dict[str, Any], exhausted: list[str]
    ) -> dict[str, Any]:
        return _run_stage(self, tenant, conversation, stage, exhausted)

    stage_task.__name__ = f"stage_{kind}"
    stage_task.__doc__ = f"Run one {kind} stage of a conversation under its lock and save it with CAS."
    task = app.task(name=f"ctxcore.stage.{kind}", bind=True, acks_late=True, base=StageTask)(stage_task)
    return task


STAGE_TASKS: dict[str, Task[Any, Any]] = {kind: _make_stage_task(kind) for kind in STAGE_ORDER}
stage_task = STAGE_TASKS
