"""A compaction job's life outside its stages: queued (coalesced, held back while failing),
started by a drain token, continued stage by stage, ended with its hold or its failure.

The stage and drain tasks (``workers.tasks``) are sent by name, so this module sits below
them; their payloads carry ids and stage records, never message bodies. A job that ended
with a failed stage backs off (``workers.failures``); one that ends over target having saved
nothing leaves a hold (``workers.holds``) that no window passes until it re-arms.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from kombu.exceptions import OperationalError

from ctxcore.errors import StoreUnavailable
from ctxcore.pipeline import STAGE_ORDER, Stage
from ctxcore.state import ConversationKey
from ctxcore.status import CompactionStatus, Hold
from ctxcore.summarize.errors import TRANSIENT_KINDS
from ctxcore.summarize.redact import scrub
from workers.app import app, queue_names, runtime
from workers.broker_queues import wait_for_stage_room
from workers.failures import FailureRecord, StageFailedError, classify_failure, public_endpoint
from workers.heartbeat import beat_until_due
from workers.holds import hold_at_job_end
from workers.journal import error_entry, write_entry
from workers.prom_worker import stage_metrics
from workers.spend import summariser_cap

__all__ = [
    "MODEL_STAGES",
    "CeleryQueue",
    "after_failure",
    "finish_job",
    "plan_and_send",
    "request_compaction",
    "send_drain_tokens",
    "send_stage",
    "start_next_job",
]

log = logging.getLogger("workers.tasks")  # the name operators filter the jobs' lines on

MODEL_STAGES: tuple[str, ...] = tuple(k for k in STAGE_ORDER if k != "hard_truncate")
# Kinds that say the endpoint itself is unusable for now: every model stage would fail alike.
_ENDPOINT_KINDS = TRANSIENT_KINDS | {"authentication"}


def send_drain_tokens(count: int = 1, ring: int | None = None) -> int:
    """Send ``count`` drain tokens of ``ring``; returns how many went out.

    A broker that refuses is logged, not raised: the job stays queued in the scheduler and
    the reconciler sends its token again after ``worker.requeue_after_seconds``.
    """
    jobs = queue_names(runtime().settings).jobs
    for sent in range(max(count, 0)):
        try:
            # ignore_result: the drain task's own option, which a send by name must repeat.
            app.send_task(
                "ctxcore.drain", kwargs={} if ring is None else {"ring": ring}, queue=jobs, ignore_result=True
            )
        except OperationalError as exc:
            log.warning("drain token not sent (%s); the reconciler sends it again", exc)
            return sent
    return max(count, 0)


def send_stage(key: ConversationKey, stage: Stage, exhausted: Sequence[str]) -> Any:
    """Send one stage task (returns its ``AsyncResult``); Flower lists it as ``tenant/conversation``.
    The job shows life until the stage is due (now) plus the liveness margin."""
    sent = app.send_task(
        f"ctxcore.stage.{stage.kind}",
        args=(key.tenant_id, key.conversation_id, stage.model_dump(mode="json"), list(exhausted)),
        queue=queue_names(runtime().settings).stages,
        argsrepr=str(key),
    )
    beat_until_due(runtime().scheduler, key)
    return sent


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


def start_next_job(ring: int | None) -> dict[str, Any]:
    """The drain task's work: start the next job of ``ring`` (else of the rings onward),
    fairly: the scheduler picks the job; a ring with more jobs gets its token back, behind
    the other rings' tokens."""
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
            planned, hold = plan_and_send(job.key, [])
        except Exception as exc:
            # Planning failed before any stage ran: record it and end the job, then fail loudly.
            after_failure(job.key, None, [], exc)
            raise
    return {"job": str(job.key), "stage": planned, **({"hold": hold.reason} if hold is not None else {})}


def finish_job(
    key: ConversationKey, ran: Sequence[str] = (), detail: str = "", *, planned: bool = True
) -> Hold | None:
    """End the running job of ``key``: close its failure record (with the hold it leaves,
    ``workers.holds``: ``ran`` its stages that saved nothing, ``detail`` how the last ended),
    queue a follow-up if due. Returns the hold."""
    rt = runtime()
    record = rt.failures.get(key)
    failed = record.run_failed
    hold = hold_at_job_end(
        record, functools.partial(rt.coordinator.sizes, key), ran=ran, detail=detail, planned=planned
    )
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


def plan_and_send(
    key: ConversationKey, exhausted: Sequence[str], detail: str = ""
) -> tuple[str | None, Hold | None]:
    """Send the next stage (its kind), or end the job (with the hold it left, if any)."""
    stage = runtime().coordinator.plan(key, exhausted=exhausted)
    if stage is None:
        return None, finish_job(key, exhausted, detail)
    send_stage(key, stage, exhausted)
    return stage.kind, None


def after_failure(key: ConversationKey, stage: str | None, exhausted: list[str], exc: BaseException) -> None:
    """A stage (or the planning of a job) failed for good: record it, then escalate or end the job.

    After a classified failure the next stage is sent with the failed kind exhausted (every
    model stage after a transient or ``authentication`` kind: they would call the same
    endpoint), so planning ends at worst with the model-free hard truncate; after any other
    exception the job ends at once."""
    rt = runtime()
    kind, message = classify_failure(exc)
    # What tenants read: the kind and the message without the deployment's secrets or URLs.
    message = scrub(message, rt.secrets, urls=True)
    cause = exc.__cause__ if isinstance(exc, StageFailedError) and exc.__cause__ is not None else exc
    log.error(
        "stage %s of %s failed for good: kind=%s %s; endpoint %s",
        stage or "planning",
        key,
        kind,
        message if kind == "internal" else f"{type(cause).__name__}: {message}",
        public_endpoint(rt.settings.model_for_tenant(key.tenant_id).base_url),
    )
    if kind == "internal":
        stage_metrics().failures.labels("internal").inc()
    if not isinstance(exc, StageFailedError) and kind != "store_unavailable":
        # Classified failures and outages were journaled by the attempt that met them.
        write_entry(
            rt.journal, key, error_entry(stage or "planning", "error", None, kind=kind, message=message)
        )
    try:
        rt.failures.record(key, kind, message, stage)
        if not isinstance(exc, StageFailedError) or stage is None:
            finish_job(key, planned=False)
            return
        failed = MODEL_STAGES if kind in _ENDPOINT_KINDS else (stage,)
        try:
            plan_and_send(key, [*exhausted, *(k for k in failed if k not in exhausted)])
        except Exception:
            # Planning after the failed stage broke too: end the job rather than strand it.
            finish_job(key, planned=False)
            raise
    except StoreUnavailable as err:
        log.error(
            "could not record the failure of %s or end its job (%s); the reconciler re-queues it "
            "(lost_task) %.0f s after its last heartbeat, once Redis answers",
            key,
            err,
            rt.scheduler.liveness_seconds,
        )
